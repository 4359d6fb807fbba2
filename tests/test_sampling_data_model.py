"""Rows split over data, tensor-parallel over model (`fineflax.sampling.replicas` with a data x model mesh):
on 4 forced CPU devices, a mesh of 2 groups x model=2 gives the one-device greedy tokens and log-probs
(f32, LoRA, GQA; and the unrolled decoder from fsdp-split params) for `generate` and for a `SamplerSession` with tool-output appends, the same sampled
tokens (row r's key is fold_in(rng, r) wherever it runs), uses both groups (each engine on its own 2
devices, half the weights per device), and reads a copy already laid out over the data x model mesh in
place (`tensor_parallel.reuse_shards`: the group's arrays are the same device buffers).

One subprocess: XLA_FLAGS must force 4 CPU devices before jax is imported.
"""
import textwrap

import pytest

from fineflax.testing.devices import run_script


SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from fineflax import lora as L
    from fineflax.testing.tolerance import logprob_tol
    from fineflax.engine import tensor_parallel as tp
    from fineflax.mesh import make_mesh
    from fineflax.models import ModelConfig, init_params
    from fineflax.sampling import generate
    from fineflax.sampling.replicas import place_weights, replicas_of
    from fineflax.sampling.session import SamplerSession
    assert jax.device_count() == 4, jax.devices()

    c = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16, eos_token_ids=(1,))
    base = init_params(c, jax.random.PRNGKey(0), std=0.3)
    lora = jax.tree.map(lambda x: x + 0.05, L.init_lora(base, c, L.LoraConfig(r=4, alpha=8.0), jax.random.PRNGKey(1)))
    mesh = make_mesh(data=2, model=2)
    groups = replicas_of("paged", mesh)
    assert [sorted(d.id for d in g.devices.flat) for g in groups] == [[0, 1], [2, 3]], groups
    assert replicas_of("paged", make_mesh(data=1, model=4)) is None  # one group: the tensor-parallel engine

    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [5, 6, 7], [20, 21], [30, 31, 32, 33]]
    kw = dict(max_new_tokens=8, dtype=jnp.float32, impl="scan", lora=lora, lora_scale=2.0, eos_ids=())

    def same(a, b, what):
      assert a.tokens.tolist() == b.tokens.tolist(), (what, a.tokens, b.tokens)
      assert a.valid.tolist() == b.valid.tolist() and a.mask.tolist() == b.mask.tolist(), what
      err = np.abs(a.logprobs - b.logprobs).max()
      # the model axis splits contractions (summed across devices): one token's path of reductions over
      # <= 5 + 8 positions bounds the difference (fineflax.testing.tolerance.logprob_tol)
      assert err <= logprob_tol(c, 5 + 8, a.logprobs), (what, err)

    one = generate(base, c, prompts, temperature=0.0, **kw)
    assert len(set(map(tuple, one.tokens.tolist()))) > 2  # rows differ: a real comparison
    same(one, generate(base, c, prompts, temperature=0.0, mesh=mesh, **kw), "generate greedy")
    same(one, generate(base, c, prompts, temperature=0.0, mesh=mesh, cache="replicas", **kw), "replicas greedy")
    key = jax.random.key(3)
    same(generate(base, c, prompts, temperature=1.0, rng=key, **kw),
         generate(base, c, prompts, temperature=1.0, rng=key, mesh=mesh, **kw), "generate sampled")

    def session(m):
      s = SamplerSession(base, c, max_total_len=24, temperature=0.0, lora=lora, lora_scale=2.0,
                         dtype=jnp.float32, eos_ids=(), mesh=m)
      s.start(prompts)
      s.decode(3)
      s.append({0: [40, 41], 3: [42], 4: [43, 44, 45]})
      s.decode(4)
      return s
    s1, s2 = session(None), session(mesh)
    same(s1.result(), s2.result(), "session with appends")
    assert [s.engine.mesh for s in s2._replicas.sessions] == groups  # both groups decode, tensor-parallel
    for s in s2._replicas.sessions:
      per = tp.bytes_per_device(s.engine.params)
      whole = sum(x.nbytes for x in jax.tree.leaves(s.engine.params))
      assert set(per) == set(s.engine.mesh.devices.flat) and max(per.values()) <= whole / 2 * 1.05, (per, whole)

    # a copy laid out over the data x model mesh (the learner's rollout copy) is read in place by each group
    laid = tp.shard_decode_params(base, c, mesh)
    q = laid["layers"]["q"]["kernel"]
    assert max(tp.bytes_per_device(q).values()) * 2 == q.nbytes  # base / model on every device
    for g in groups:
      on_g = place_weights(laid, None, c, g)[0]["layers"]["q"]["kernel"]
      ptr = lambda x: {s.device: s.data.unsafe_buffer_pointer() for s in x.addressable_shards}
      assert on_g.sharding.mesh == g and all(ptr(q)[d] == p for d, p in ptr(on_g).items()), "copied"
    same(one, generate(laid, c, prompts, temperature=0.0, mesh=mesh, **kw), "generate from the laid-out copy")
    # full training's rollouts: params split over the update's fsdp axis, the unrolled decoder
    from fineflax.mesh import shard_params
    upd = shard_params(base, make_mesh(data=1, fsdp=4), min_size=0)
    un = dict(kw, impl="unrolled", lora=None)
    same(generate(base, c, prompts, temperature=0.0, **un),
         generate(upd, c, prompts, temperature=0.0, mesh=mesh, **un), "unrolled, fsdp-split params")
    print("DATA-MODEL-OK")
""")


@pytest.mark.long
def test_rows_over_data_groups_tensor_parallel_over_model_equal_one_device():
  r = run_script(SCRIPT, devices=4, timeout=900)
  assert r.returncode == 0 and "DATA-MODEL-OK" in r.stdout, r.stdout[-3000:] + r.stderr[-6000:]
