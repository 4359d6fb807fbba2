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
    np.testing.assert_allclose(float(m1["loss"]), float(m2["loss"]), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5),
                 s1["params"], s2["params"])
    # the unrolled layer loop (model.layer_loop) under the same mesh: same step
    import dataclasses
    train_u, _ = make_sft_fns(opt, model_config=dataclasses.replace(c, layer_loop="unrolled"), lora_scale=2.0)
    s3, m3 = train_u(replicate(init_state(lora, opt, 0), mesh), shard_params(base, mesh),
                     shard_batch(batch, mesh, batch_axis=1))
    np.testing.assert_allclose(float(m1["loss"]), float(m3["loss"]), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5),
                 s1["params"], s3["params"])
    print("OK", float(m1["loss"]))
""")


@pytest.mark.long
def test_sharded_sft_step_equals_single_device():
  r = run_script(SCRIPT, devices=4, timeout=300)
  assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
