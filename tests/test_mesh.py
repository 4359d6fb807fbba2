"""The SFT step on a 2x2 ("data", "fsdp") mesh of forced CPU devices equals the one-device step (with the
layer scan and with the unrolled layer loop)."""
import textwrap

import pytest

from fineflax.testing.devices import run_script


SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, optax
    from fineflax.models import ModelConfig, init_params
    from fineflax import lora as L
    from fineflax.models.quantize import quantize_params
    from fineflax.train.sft_step import make_sft_fns
    from fineflax.train.state import init_state
    from fineflax.mesh import make_mesh, shard_batch, shard_params, replicate
    from fineflax.testing.batches import random_sft_batch
    from fineflax.testing.tolerance import check_first_adamw_step, sum_order_tol
    assert jax.device_count() == 4, jax.devices()
    c = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16)
    base = quantize_params(init_params(c, jax.random.PRNGKey(0)), kind="nf4")
    cfg = L.LoraConfig(r=4, alpha=8.0)
    lora = L.init_lora(base, c, cfg, jax.random.PRNGKey(1))
    lora = jax.tree.map(lambda x: x + 0.01, lora)
    opt = optax.adamw(1e-2)
    train, _ = make_sft_fns(opt, model_config=c, lora_scale=2.0)
    rng = np.random.RandomState(0)
    batch = random_sft_batch(rng, (2, 8, 16), 256)  # 2 micro-batches of 8 rows x 16 tokens
    s1, m1 = train(init_state(lora, opt, 0), base, batch)
    mesh = make_mesh(data=2, fsdp=2)
    s2, m2 = train(replicate(init_state(lora, opt, 0), mesh), shard_params(base, mesh),
                   shard_batch(batch, mesh, batch_axis=1))
    assert len(m2["loss"].sharding.device_set) == 4
    # Tolerances from the arithmetic (fineflax/testing/tolerance.py), none tuned: the loss and every LoRA
    # gradient entry sum over the step's N = 2 x 8 x 16 = 256 token terms (+ 256 vocabulary terms of each
    # token's log-sum-exp in the loss), in another order on the mesh; one AdamW step (lr 1e-2, eps 1e-8).
    N = batch["tokens"].size
    def same_step(m, s):
      assert abs(float(m["loss"]) - float(m1["loss"])) <= float(sum_order_tol(N + 256, abs(float(m1["loss"]))))
      return check_first_adamw_step(lora, s1["params"], s["params"], s1["opt_state"][0].mu, N, 1e-2, 1e-8)
    margin = same_step(m2, s2)
    # the unrolled layer loop (model.layer_loop) under the same mesh: same step
    import dataclasses
    train_u, _ = make_sft_fns(opt, model_config=dataclasses.replace(c, layer_loop="unrolled"), lora_scale=2.0)
    s3, m3 = train_u(replicate(init_state(lora, opt, 0), mesh), shard_params(base, mesh),
                     shard_batch(batch, mesh, batch_axis=1))
    margin = max(margin, same_step(m3, s3))
    print("OK", float(m1["loss"]), f"tolerance margin {margin:.3f}")
""")


@pytest.mark.long
def test_sharded_sft_step_equals_single_device():
  r = run_script(SCRIPT, devices=4, timeout=300)
  assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
