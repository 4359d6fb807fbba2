"""Tensor-parallel decoding (`fineflax.engine.tensor_parallel`): the engine on a "model" mesh axis of 2 or 4
forced CPU devices gives the one-device engine's greedy tokens and log-probs (f32, with LoRA: one adapter
for all rows, and per-row adapters), holds 1/N of the weights and pages per device, and its compiled
decode has one all-reduce per attention block and per MLP block and no all-gather of weights.

One subprocess runs the mesh cases: XLA_FLAGS must force 4 CPU devices before jax is imported.
"""
import textwrap

import jax
import numpy as np
import pytest

from fineflax.engine import tensor_parallel as tp
from fineflax.models import ModelConfig, init_params
from fineflax.testing.devices import run_script


def _config(**kw):
  base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
              num_kv_heads=2, head_dim=16, eos_token_ids=(1,))
  return ModelConfig(**{**base, **kw})


@pytest.mark.fast
def test_indivisible_heads_kv_heads_or_intermediate_are_clear_errors():
  tp.check_tp(_config(), 2)  # divisible: no error
  with pytest.raises(ValueError, match="num_heads=6 is not divisible by 4"):
    tp.check_tp(_config(num_heads=6, num_kv_heads=6), 4)
  with pytest.raises(ValueError, match="num_kv_heads=2 is not divisible by 4"):
    tp.check_tp(_config(), 4)
  with pytest.raises(ValueError, match="intermediate_size=130 is not divisible by 4"):
    tp.check_tp(_config(num_kv_heads=4, intermediate_size=130), 4)


@pytest.mark.fast
def test_column_blocks_hold_the_same_nf4_kernel_and_bad_splits_are_clear_errors():
  from fineflax.models.quantize import quantize_params
  from fineflax.quant import quantize_nf4
  from fineflax.quant.column_blocks import ColumnBlocks, column_blocks
  w = quantize_nf4(jax.random.normal(jax.random.PRNGKey(0), (3, 64, 256)), lead_dims=1)  # double-quantised
  dense = np.asarray(w.dequantize(np.float32))
  for n in (1, 2, 4):
    blocked = column_blocks(w, n)
    assert blocked.shape == (64, 256) and np.array_equal(np.asarray(blocked.dequantize(np.float32)), dense)
  with pytest.raises(ValueError, match="not a multiple of 8 devices x NF4 block 64"):
    column_blocks(w, 8)
  c = _config(head_dim=64, intermediate_size=256)
  params = quantize_params(init_params(c, jax.random.PRNGKey(0)), kind="nf4")
  laid = tp.tp_layout(params, 2)
  assert isinstance(laid["layers"]["q"]["kernel"], ColumnBlocks)  # column kernels re-ordered
  assert laid["layers"]["o"]["kernel"] is params["layers"]["o"]["kernel"]  # row kernels split as they are
  with pytest.raises(ValueError, match="NF4 kernel of 'k'"):  # k: 2 kv heads x 64 = 128 columns
    tp.tp_layout(params, 4)
  int8 = quantize_params(init_params(c, jax.random.PRNGKey(0)), kind="int8")
  with pytest.raises(ValueError, match="Int8Tensor kernel"):
    tp.tp_layout(int8, 2)


@pytest.mark.fast
def test_megatron_layout_of_the_decode_params():
  c = _config()
  shapes = jax.eval_shape(lambda: init_params(c, jax.random.PRNGKey(0)))
  specs = tp.decode_param_specs(shapes, c, 2)
  layers = specs["layers"]
  for name in ("q", "k", "v", "gate", "up"):  # columns: the output axis
    assert layers[name]["kernel"] == jax.sharding.PartitionSpec(None, None, "model"), name
  for name in ("o", "down"):  # rows: the input axis
    assert layers[name]["kernel"] == jax.sharding.PartitionSpec(None, "model", None), name
  assert layers["attn_norm"] == jax.sharding.PartitionSpec()
  assert specs["embed"] == jax.sharding.PartitionSpec("model", None)
  assert specs["lm_head"]["kernel"] == jax.sharding.PartitionSpec(None, "model")
  assert tp.decode_param_specs(shapes, _config(vocab_size=255), 2)["embed"] == jax.sharding.PartitionSpec()
  lora = {"q": {"a": np.zeros((2, 64, 4)), "b": np.zeros((2, 4, 64))},
          "down": {"a": np.zeros((2, 3, 128, 4)), "b": np.zeros((2, 3, 4, 64))}}  # one; per-row stacked
  ls = tp.lora_specs(lora, 2)
  assert ls["q"]["a"] == jax.sharding.PartitionSpec() and ls["q"]["b"][-1] == "model"
  assert ls["down"]["a"][-2] == "model" and ls["down"]["b"] == jax.sharding.PartitionSpec()


SCRIPT = textwrap.dedent("""
    import re, math
    import jax, jax.numpy as jnp, numpy as np
    from fineflax.models import ModelConfig, init_params
    from fineflax import lora as L
    from fineflax.engine import Engine, Request, tensor_parallel as tp
    from fineflax.engine.programs import _PROGRAMS
    from fineflax.mesh import make_mesh
    from fineflax.testing.tolerance import logprob_tol
    from fineflax.sampling import generate
    assert jax.device_count() == 4, jax.devices()

    def collectives(engine):
      (key,) = [k for k in engine.programs]
      hlo = _PROGRAMS[key].as_text()
      ops = {}
      for op in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
        ops[op] = [m.group(1) for m in re.finditer(rf"= (\\([^)]*\\)|\\S+) {op}(?:-start)?\\(", hlo)]
      return ops

    def sizes(shape):  # "f32[4,1,64]{2,1,0}" -> [256]; a tuple of shapes: each one's
      return [math.prod(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\\[([0-9,]*)\\]", shape)]

    def run(params, c, mesh, impl, **kw):
      e = Engine(params, c, max_rows=4, num_pages=40, page_size=8, dtype=jnp.float32, impl=impl, mesh=mesh,
                 chunk_size=8, **kw)
      prompts = [[3, 4, 5 + i, 6] * (i + 1) for i in range(4)]
      seqs = [e.submit(Request(p, max_new_tokens=10, eos_ids=(), adapter=(None if "adapters" not in kw else [None, 0, 1, 0][i])))
              for i, p in enumerate(prompts)]
      e.run()
      return e, [s.tokens for s in seqs], np.array([s.raw_logprobs for s in seqs])

    def check(c, n, impl, layer_bodies, params=None, **kw):
      params = init_params(c, jax.random.PRNGKey(0), std=0.3) if params is None else params
      _, tok1, lp1 = run(params, c, None, impl, **kw)
      mesh = make_mesh(data=1, model=n, devices=jax.devices()[:n])
      e, tokn, lpn = run(params, c, mesh, impl, **kw)
      assert tok1 == tokn, (tok1, tokn)
      # model=n splits contractions (summed across devices): one token's path of reductions over the
      # longest prompt + 10 positions bounds the difference (fineflax.testing.tolerance.logprob_tol)
      assert np.abs(lp1 - lpn).max() <= logprob_tol(c, 16 + 10, lp1), np.abs(lp1 - lpn).max()
      assert len(set(map(tuple, tok1))) > 1  # the rows differ: a real comparison
      # memory: each device holds its 1/n of every split leaf (here all but norms), and 1/n of the pool
      whole = sum(x.nbytes for x in jax.tree.leaves(e.params))
      per = tp.bytes_per_device(e.params)
      assert len(per) == n and max(per.values()) <= whole / n * 1.05, (per, whole)
      pool = tp.bytes_per_device(e.pool)
      assert max(pool.values()) * n == sum(x.nbytes for x in jax.tree.leaves(e.pool)), pool
      ops = collectives(e)
      # [rows, 1, H] sums (with LoRA one tuple all-reduce: the base's partial output and the split a's x @ a)
      hidden = [s for s in ops["all-reduce"] if 4 * c.hidden_size in sizes(s)]
      assert len(hidden) == 2 * layer_bodies + 1, ops  # o and down of each layer, + the vocab-split lookup
      smallest = min(x.size // n for x in jax.tree.leaves(e.params) if x.size >= 1024)
      assert all(max(sizes(s)) < smallest for s in ops["all-gather"]), ops  # no weight is gathered
      assert not ops["reduce-scatter"] and not ops["all-to-all"], ops
      return params

    lcfg = L.LoraConfig(r=4, alpha=8.0)
    # MHA (kv heads = heads) on 4 devices, the scanned decoder (one layer body in the loop), one LoRA
    c = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                    num_kv_heads=4, head_dim=16, eos_token_ids=(1,))
    base = init_params(c, jax.random.PRNGKey(0), std=0.3)
    lora = jax.tree.map(lambda x: x + 0.05, L.init_lora(base, c, lcfg, jax.random.PRNGKey(1)))
    check(c, 4, "scan", 1, lora=lora, lora_scale=2.0)
    # GQA (2 query heads a kv head) on 2 devices, the unrolled decoder, per-row adapters
    c = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16, eos_token_ids=(1,))
    base = init_params(c, jax.random.PRNGKey(0), std=0.3)
    adapters = [(jax.tree.map(lambda x: x + 0.03 * (i + 1), L.init_lora(base, c, lcfg, jax.random.PRNGKey(i))), 1.5)
                for i in range(2)]
    check(c, 2, "unrolled", c.num_layers, adapters=adapters)
    # NF4 (QLoRA) base on 2 devices with a LoRA: codes and block scales split (q/k/v/gate/up as column blocks)
    from fineflax.models.quantize import quantize_params
    c4 = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=64, eos_token_ids=(1,))
    nf4 = quantize_params(init_params(c4, jax.random.PRNGKey(0), std=0.3), kind="nf4")
    lora = jax.tree.map(lambda x: x + 0.05, L.init_lora(nf4, c4, lcfg, jax.random.PRNGKey(1)))
    check(c4, 2, "scan", 1, params=nf4, lora=lora)
    # generate() on a model mesh equals one device (greedy)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    one = generate(base, c, prompts, max_new_tokens=6, temperature=0.0, dtype=jnp.float32, impl="scan")
    two = generate(base, c, prompts, max_new_tokens=6, temperature=0.0, dtype=jnp.float32, impl="scan",
                   mesh=make_mesh(data=1, model=2, devices=jax.devices()[:2]))
    assert np.array_equal(one.tokens, two.tokens), (one.tokens, two.tokens)
    try:
      Engine(base, c, max_rows=1, num_pages=4, attention="pallas", mesh=make_mesh(data=1, model=2, devices=jax.devices()[:2]))
      raise AssertionError("the unpartitioned Pallas kernel was accepted on a model mesh")
    except ValueError as e:
      assert "pallas" in str(e), e
    print("TP-OK")
""")


def test_tensor_parallel_engine_equals_one_device():
  r = run_script(SCRIPT, devices=4, timeout=900)
  assert r.returncode == 0 and "TP-OK" in r.stdout, r.stdout[-3000:] + r.stderr[-6000:]
