"""The fused NF4 kernel on tensor-parallel shards (`fineflax.quant.sharded.ShardedNF4`, issue 44): on 2 forced
CPU devices (the kernel interpreted), a column kernel's and a row kernel's products equal x @ W.dequantize()
(f32; bf16 to bf16 rounding), stacked layers read in place; a row split that cuts the nested scale groups
falls back to XLA's product; the tensor-parallel engine with the kernel forced gives the one-device engine's
greedy tokens, keeps one all-reduce per attention and MLP block, and gathers no weight; so does the K-major
layout (FINEFLAX_NF4_LAYOUT=kmajor), its shards through the K-major kernel.

One subprocess: XLA_FLAGS must force the devices before jax is imported.
"""
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.quant import quantize_nf4
from fineflax.quant.column_blocks import column_blocks
from fineflax.quant.matmul import quantized_matmul
from fineflax.quant.nf4_kmajor import from_nf4
from fineflax.quant.sharded import ShardedNF4
from fineflax.testing.devices import run_script


def _mesh():
  from fineflax.mesh import make_mesh
  return make_mesh(data=1, model=1, devices=jax.devices()[:1])


@pytest.mark.fast
def test_sharded_nf4_on_one_device_is_the_plain_product_and_bad_input_is_a_clear_error(monkeypatch):
  monkeypatch.setenv("FINEFLAX_NF4_KERNEL", "pallas")
  mesh, key = _mesh(), jax.random.PRNGKey(0)
  row = quantize_nf4(jax.random.normal(key, (2, 128, 128)), lead_dims=1)  # 256 blocks: one nested group
  col = quantize_nf4(jax.random.normal(key, (128, 128)))
  for w, ref in ((ShardedNF4(row, mesh, "row").at_layer(1), jax.tree.map(lambda a: a[1], row)),
                 (ShardedNF4(column_blocks(col, 1), mesh, "column"), col),
                 (ShardedNF4(from_nf4(row), mesh, "row").at_layer(1), jax.tree.map(lambda a: a[1], row)),
                 (ShardedNF4(from_nf4(col), mesh, "column"), col)):
    assert w.local() is not None and w.shape == (128, 128) and w.lead_shape == ()
    x = jax.random.normal(key, (3, 128), jnp.float32)
    text = str(jax.make_jaxpr(lambda x, w: quantized_matmul(x, w, jnp.float32))(x, w))
    assert "shard_map" in text and "pallas_call" in text
    np.testing.assert_allclose(quantized_matmul(x, w, jnp.float32), x @ ref.dequantize(jnp.float32), rtol=1e-5,
                               atol=1e-4)
    np.testing.assert_array_equal(w.dequantize(jnp.float32), ref.dequantize(jnp.float32))
  with pytest.raises(ValueError, match="kind='rows'"):
    ShardedNF4(row, mesh, "rows")
  with pytest.raises(ValueError, match="must be a ColumnBlocks or an NF4KMajor, got NF4Tensor"):
    ShardedNF4(col, mesh, "column")
  with pytest.raises(ValueError, match="one leading"):
    ShardedNF4(col, mesh, "row").at_layer(0)

SCRIPT = textwrap.dedent("""
    import os, re
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from fineflax.mesh import make_mesh
    from fineflax.quant import quantize_nf4
    from fineflax.quant.column_blocks import column_blocks
    from fineflax.quant.matmul import quantized_matmul
    from fineflax.quant.sharded import ShardedNF4
    assert jax.device_count() == 2, jax.devices()
    os.environ["FINEFLAX_NF4_KERNEL"] = "pallas"
    mesh = make_mesh(data=1, model=2, devices=jax.devices())

    def split(tree, names):  # the named leaves split along their last axis over "model", the rest replicated
      return tree.replace(**{k: jax.device_put(getattr(tree, k), NamedSharding(
          mesh, P(*([None] * (getattr(tree, k).ndim - 1)), "model"))) for k in names})

    def product(x, w, dtype):
      f = lambda x, w: quantized_matmul(x, w, dtype)
      text = str(jax.make_jaxpr(f)(x, w))
      return jax.jit(f)(x, w), "pallas_call" in text and "shard_map" in text

    key = jax.random.PRNGKey(0)
    for lead in ((), (3,)):
      col = quantize_nf4(jax.random.normal(key, lead + (128, 256)), lead_dims=len(lead))
      row = quantize_nf4(jax.random.normal(key, lead + (256, 128)), lead_dims=len(lead))  # 512 blocks: 256 a device
      blocks = column_blocks(col, 2)
      blocks = blocks.replace(blocks=split(blocks.blocks, ("codes", "absmax")))
      cases = (("column", ShardedNF4(blocks, mesh, "column"), col),
               ("row", ShardedNF4(split(row, ("codes", "absmax")), mesh, "row"), row))
      for kind, w, ref in cases:
        if lead:
          w, ref = w.at_layer(2), jax.tree.map(lambda a: a[2], ref)
        for m in (1, 3, 64):
          x = jax.random.normal(jax.random.PRNGKey(m), (m, ref.shape[0]), jnp.float32)
          y, fused = product(x, w, jnp.float32)
          assert fused, (kind, lead, m)
          want = np.asarray(x @ ref.dequantize(jnp.float32))
          assert np.abs(np.asarray(y) - want).max() <= 1e-4 * np.abs(want).max(), (kind, lead, m)
          yb, _ = product(x.astype(jnp.bfloat16), w, jnp.bfloat16)
          xb = x.astype(jnp.bfloat16).astype(jnp.float32)
          wantb = np.asarray(xb @ ref.dequantize(jnp.bfloat16).astype(jnp.float32))
          assert np.abs(np.asarray(yb, np.float32) - wantb).max() <= 2 ** -7 * np.abs(wantb).max(), (kind, lead, m)
    # a row split inside a nested scale group (256 blocks in all, 128 a device): XLA's product, same values
    small = quantize_nf4(jax.random.normal(key, (128, 128)))
    w = ShardedNF4(split(small, ("codes", "absmax")), mesh, "row")
    assert w.local() is None
    x = jax.random.normal(key, (2, 128), jnp.float32)
    y, fused = product(x, w, jnp.float32)
    assert not fused and np.allclose(y, x @ small.dequantize(jnp.float32), rtol=1e-5, atol=1e-5)
    print("PRODUCTS-OK")

    from fineflax.engine import Engine, Request
    from fineflax.engine.programs import _PROGRAMS
    from fineflax.models import ModelConfig, init_params
    from fineflax.models.quantize import quantize_params
    c = ModelConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=64, eos_token_ids=(1,))
    params = quantize_params(init_params(c, jax.random.PRNGKey(0), std=0.3), kind="nf4")

    def run(mesh, mode):
      os.environ["FINEFLAX_NF4_KERNEL"] = mode
      e = Engine(params, c, max_rows=2, num_pages=24, page_size=8, dtype=jnp.float32, impl="unrolled", mesh=mesh,
                 chunk_size=4)
      seqs = [e.submit(Request([3, 4, 5 + i, 6] * (i + 1), max_new_tokens=6, eos_ids=())) for i in range(2)]
      e.run()
      return e, [s.tokens for s in seqs]

    _, one = run(None, "xla")
    e, two = run(mesh, "pallas")
    assert one == two and one[0] != one[1], (one, two)
    kernels = [k for k in jax.tree.leaves(e.params, is_leaf=lambda x: isinstance(x, ShardedNF4))
               if isinstance(k, ShardedNF4)]
    assert len(kernels) == 7 and all(k.local() is not None for k in kernels), kernels  # q k v o gate up down
    from fineflax.engine import tensor_parallel as tp
    again = tp.shard_decode_params(e.params, c, mesh)  # engine_factory's params go through it twice: unchanged
    assert jax.tree.structure(again) == jax.tree.structure(e.params)
    assert all(a is b or a.sharding == b.sharding for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(e.params)))
    (program,) = [k for k in e.programs]
    hlo = _PROGRAMS[program].as_text()
    gathered = re.findall(r"= (\\S+) all-gather(?:-start)?\\(", hlo)
    assert not [g for g in gathered if g.startswith("u8")], gathered  # no NF4 codes gathered
    reduced = re.findall(r"= (\\S+) all-reduce(?:-start)?\\(", hlo)
    # o and down of each layer: the shard_map's psum of the kernel's [rows, H] partial products (GSPMD's own
    # product would reduce [rows, 1, H]); the vocab-split lookup's [rows, 1, H]
    assert sum(re.match(rf"f32\\[2,{c.hidden_size}\\]", s) is not None for s in reduced) == 2 * c.num_layers, reduced
    assert sum(re.match(rf"f32\\[2,1,{c.hidden_size}\\]", s) is not None for s in reduced) == 1, reduced
    print("ENGINE-OK")

    # the K-major layout (FINEFLAX_NF4_LAYOUT=kmajor): every NF4 kernel K-major, split over out or in, its
    # shards through nf4_kmajor_gemv; the same greedy tokens, no codes gathered
    from fineflax.quant import nf4_kmajor_gemv as km
    from fineflax.quant.nf4_kmajor import NF4KMajor
    calls = []
    kernel = km.kmajor_matmul
    km.kmajor_matmul = lambda *a, **kw: calls.append(a[1].shape) or kernel(*a, **kw)
    os.environ["FINEFLAX_NF4_LAYOUT"] = "kmajor"
    e, kmaj = run(mesh, "pallas")
    assert kmaj == one, (one, kmaj)
    kernels = [k for k in jax.tree.leaves(e.params, is_leaf=lambda x: isinstance(x, ShardedNF4))
               if isinstance(k, ShardedNF4)]
    assert len(kernels) == 7 and all(isinstance(k.w, NF4KMajor) and k.local() is not None for k in kernels)
    assert set(calls) >= {(128, 128), (128, 64)}, calls  # each device's shard [in, out]: q, o, gate, up, down; k, v
    (program,) = [k for k in e.programs]
    gathered = re.findall(r"= (\\S+) all-gather(?:-start)?\\(", _PROGRAMS[program].as_text())
    assert not [g for g in gathered if g.startswith("u8")], gathered
    print("KMAJOR-OK")
""")


@pytest.mark.slow
def test_nf4_kernel_on_tensor_parallel_shards():
  r = run_script(SCRIPT, devices=2, timeout=1200)
  assert r.returncode == 0 and "KMAJOR-OK" in r.stdout, r.stdout[-3000:] + r.stderr[-6000:]
