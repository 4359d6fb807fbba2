"""The K-major NF4 layout (`fineflax.quant.nf4_kmajor`) and its kernel (`nf4_kmajor_gemv`, Pallas' interpreter
on CPU): the layout dequantises to the bitsandbytes-layout values bit for bit, products equal x @ W.dequantize()
to the output's rounding on both paths, odd shapes and layer views, bad input is a clear error, and the
unrolled decoder's greedy tokens through the kernel equal the dequantised weights'."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.quant import nf4_kmajor_gemv as km
from fineflax.quant import quantize_nf4
from fineflax.quant.matmul import decode_layout, quantized_matmul
from fineflax.quant.nf4_kmajor import NF4KMajor, from_nf4
from fineflax.quant.nf4_layer import NF4Layer


def _weights(shape, double_quant=True, seed=0):
  rng = np.random.default_rng(seed)
  return quantize_nf4(jnp.asarray(rng.standard_normal(shape) * 0.02, jnp.float32), 64, double_quant,
                      lead_dims=len(shape) - 2)


def _close(got, want, dtype):
  """Within one rounding of a bf16 output (or of W's bf16 rounding on the fma path); f32: f32 sums in another order."""
  rtol = 2 ** -7 if dtype == jnp.bfloat16 else 1e-5
  np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=rtol, atol=rtol * np.abs(want).max())


def _reference(x, w, dtype):
  return np.asarray(jnp.matmul(x.astype(jnp.float32), w.dequantize(dtype).astype(jnp.float32),
                               precision=jax.lax.Precision.HIGHEST))


@pytest.mark.fast
@pytest.mark.parametrize("double_quant", [True, False])
def test_the_kmajor_layout_dequantises_bit_for_bit(double_quant):
  w = _weights((2, 448, 192), double_quant)  # stacked, K / 2 = 7 x 32
  kmaj = from_nf4(w)
  assert kmaj.codes.shape == (2, 192, 224) and kmaj.scale_even.shape == (2, 3, 224) and kmaj.shape == (448, 192)
  for dtype in (jnp.float32, jnp.bfloat16):
    want = np.asarray(w.dequantize(dtype).astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(kmaj.dequantize(dtype).astype(jnp.float32)), want)
    np.testing.assert_array_equal(np.asarray(NF4Layer(kmaj, 1).dequantize(dtype).astype(jnp.float32)), want[1])


@pytest.mark.fast
def test_concatenated_kmajor_copies_dequantise_to_the_concatenated_weights_bit_for_bit():
  """from_nf4_concat([Wq, Wk, Wv]) (stacked) == concatenate of their dequantised values along N; mismatched K or
  a non-NF4 member is refused, naming the member."""
  from fineflax.quant.nf4_kmajor import concat_reason, from_nf4_concat
  ws = [_weights((2, 256, n), seed=n) for n in (128, 64, 192)]
  fused = from_nf4_concat(tuple(ws))
  assert fused.shape == (256, 384) and fused.codes.shape == (2, 384, 128)
  for dtype in (jnp.float32, jnp.bfloat16):
    want = np.concatenate([np.asarray(w.dequantize(dtype).astype(jnp.float32)) for w in ws], axis=-1)
    np.testing.assert_array_equal(np.asarray(fused.dequantize(dtype).astype(jnp.float32)), want)
  assert concat_reason((ws[0], np.zeros((256, 64)))).startswith("tensor 1: ndarray with leading axes None")
  with pytest.raises(ValueError, match=r"from_nf4_concat: tensor 1: K=448, leading axes \(2,\)"):
    from_nf4_concat((ws[0], _weights((2, 448, 64))))


PRODUCTS = [(1, 256, 128, jnp.bfloat16), (3, 448, 192, jnp.float32), (17, 448, 192, jnp.bfloat16),
            (64, 256, 128, jnp.float32), (5, 576, 128, jnp.float32)]


@pytest.mark.parametrize("m,k,n,dtype", [pytest.param(*PRODUCTS[0], marks=pytest.mark.fast), *PRODUCTS[1:]])
def test_products_equal_the_dequantised_product(m, k, n, dtype):
  w = _weights((k, n), seed=m)
  kmaj = from_nf4(w)
  x = jnp.asarray(np.random.default_rng(m).standard_normal((m, k)), dtype)
  cfg = km.default_config(m, k, n)
  assert cfg.path == ("fma" if m <= km.FMA_MAX_ROWS else "dot")
  _close(km.kmajor_matmul(x, kmaj, dtype, interpret=True), _reference(x, w, dtype), dtype)
  for other in (KMajorVariants := [km.KMajorConfig(path=cfg.path, decode="select", bkb=16, iters=2),
                                   km.KMajorConfig(path=cfg.path, bn=128 if n % 128 == 0 else 64, bkb=32, iters=1)]):
    _close(km.kmajor_matmul(x, kmaj, dtype, other, interpret=True), _reference(x, w, dtype), dtype)
  assert len(KMajorVariants) == 2


@pytest.mark.fast
def test_the_dequantised_planes_are_the_kernels_rows_bit_for_bit_and_deq_products_match():
  """deq path: dequantize_planes gives W[0::2]^T and W[1::2]^T of dequantize(dtype) exactly (stacked layer view,
  several tiles and groups a program); its products (M = 1, 3, 257 > DOT_MAX_ROWS) equal the dequantised one."""
  w = _weights((2, 448, 256), seed=3)  # K / 2 = 224 = 7 x 32
  view = NF4Layer(from_nf4(w), 1)
  sliced = jax.tree.map(lambda a: a[1], w)
  cfg = km.KMajorConfig(path="deq", bn=128, bkb=32, iters=7, decode="select")
  for dtype in (jnp.bfloat16, jnp.float32):
    we, wo = km.dequantize_planes(view, dtype, cfg, interpret=True)
    dense = np.asarray(sliced.dequantize(dtype).astype(jnp.float32))
    assert we.dtype == dtype and we.shape == (256, 224)
    np.testing.assert_array_equal(np.asarray(we.astype(jnp.float32)), dense[0::2].T)
    np.testing.assert_array_equal(np.asarray(wo.astype(jnp.float32)), dense[1::2].T)
  we, _ = km.dequantize_planes(view, jnp.float32, interpret=True)  # default tile, shrunk to K / 2 = 7 x 32
  np.testing.assert_array_equal(np.asarray(we), np.asarray(sliced.dequantize(jnp.float32))[0::2].T)
  rng = np.random.default_rng(0)
  for m, dtype in ((1, jnp.float32), (3, jnp.bfloat16), (km.DOT_MAX_ROWS + 1, jnp.bfloat16)):
    x = jnp.asarray(rng.standard_normal((m, 448)), dtype)
    got = km.kmajor_matmul(x, view, dtype, dataclasses.replace(cfg, decode="shfl", bkb=16, iters=2), interpret=True)
    assert got.shape == (m, 256) and got.dtype == dtype
    _close(got, _reference(x, sliced, dtype), dtype)
  with pytest.raises(ValueError, match=r"M=257 rows on the dot path"):
    km.kmajor_matmul(jnp.ones((257, 448)), view, cfg=km.KMajorConfig(path="dot", bkb=32, iters=1), interpret=True)


@pytest.mark.fast
def test_a_layer_view_is_read_in_place_and_quantized_matmul_dispatches(monkeypatch):
  """An NF4Layer of a stacked NF4KMajor equals the sliced layer's product; quantized_matmul runs the kernel
  under FINEFLAX_NF4_KERNEL=pallas (its gradient dequantises) and XLA for rows past DEFAULT_MAX_ROWS."""
  w = _weights((3, 256, 128))
  view = NF4Layer(from_nf4(w), 2)
  sliced = jax.tree.map(lambda a: a[2], w)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 256)), jnp.float32)
  _close(km.kmajor_matmul(x, view, jnp.float32, interpret=True), _reference(x, sliced, jnp.float32), jnp.float32)
  calls = []
  kernel = km.kmajor_matmul
  monkeypatch.setattr(km, "kmajor_matmul", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))
  monkeypatch.setenv("FINEFLAX_NF4_KERNEL", "pallas")
  y, grad = jax.value_and_grad(lambda x: quantized_matmul(x, view, jnp.float32).sum())(x)
  _close(y, _reference(x, sliced, jnp.float32).sum(), jnp.float32)
  np.testing.assert_allclose(grad, np.broadcast_to(np.asarray(sliced.dequantize(jnp.float32)).sum(1), x.shape),
                             rtol=1e-5, atol=1e-6)
  big = jnp.ones((km.DEFAULT_MAX_ROWS + 1, 256), jnp.float32)
  _close(quantized_matmul(big, view, jnp.float32), _reference(big, sliced, jnp.float32), jnp.float32)
  assert calls == [(2, 256)]
  monkeypatch.setenv("FINEFLAX_NF4_KERNEL", "xla")
  quantized_matmul(x, view, jnp.float32)
  assert calls == [(2, 256)]


@pytest.mark.fast
def test_bad_input_is_a_clear_error(monkeypatch):
  with pytest.raises(ValueError, match=r"N % 64 == 0"):
    from_nf4(quantize_nf4(jnp.ones((64, 96)), 64))
  with pytest.raises(ValueError, match=r"K/2=224 is not a multiple of bkb \* iters = 128 \* 2"):
    km.kmajor_matmul(jnp.ones((1, 448)), from_nf4(_weights((448, 128))), cfg=km.KMajorConfig(), interpret=True)
  with pytest.raises(ValueError, match=r"x of shape \(1, 100\) for W \[K=448, N=128\]"):
    km.kmajor_matmul(jnp.ones((1, 100)), from_nf4(_weights((448, 128))), interpret=True)
  assert km.default_config(65, 256, 128) is None and km.default_config(1, 2 * 8, 64) is None
  with pytest.raises(ValueError, match=r"dequantize_planes: no tile of >= 16 bytes divides K / 2"):
    km.dequantize_planes(from_nf4(_weights((16, 64))), interpret=True)
  with pytest.raises(ValueError, match=r"dequantize_planes: N=128 is not a multiple of bn=192"):
    km.dequantize_planes(from_nf4(_weights((64, 128))), cfg=km.KMajorConfig(bn=192, bkb=16, iters=1), interpret=True)
  # fma: fewer tiles a program while the grid is under MIN_PROGRAMS (8B k/v: 16 x 8 = 128 programs at 4 tiles)
  assert km.default_config(1, 4096, 14336).iters == 2 and km.default_config(1, 4096, 1024).iters == 1
  # dot: 4 tiles a program (fewer split-K partials) unless the grid falls under MIN_PROGRAMS / 2
  assert km.default_config(64, 4096, 14336) == km.KMajorConfig(path="dot", bkb=128, iters=4)
  assert km.default_config(16, 2048, 2048).iters == 1 and km.default_config(16, 2048, 8192).iters == 4
  monkeypatch.setenv("FINEFLAX_NF4_LAYOUT", "nibbles")
  with pytest.raises(ValueError, match=r"FINEFLAX_NF4_LAYOUT='nibbles'; expected one of \('auto', 'kmajor', 'bnb'\)"):
    decode_layout()
  monkeypatch.setenv("FINEFLAX_NF4_LAYOUT", "auto")
  monkeypatch.setenv("FINEFLAX_NF4_KERNEL", "auto")
  assert decode_layout() == "bnb"  # CPU: XLA's products, no copy
  monkeypatch.setenv("FINEFLAX_NF4_KERNEL", "pallas")
  assert decode_layout() == "kmajor"


def test_greedy_decode_through_the_kmajor_kernel_equals_the_dequantised_forward(monkeypatch):
  """A tiny random NF4 Llama (f32, unrolled decoder): greedy tokens with every linear through the K-major
  kernel (FINEFLAX_NF4_KERNEL=pallas, interpreted) equal those decoding the dequantised weights."""
  from tests._sampling_fixtures import nf4_greedy_case
  greedy = nf4_greedy_case("unrolled")
  calls = []
  kernel = km.kmajor_matmul
  monkeypatch.setattr(km, "kmajor_matmul", lambda *a, **kw: calls.append(a[1].shape) or kernel(*a, **kw))
  monkeypatch.setenv("FINEFLAX_NF4_KERNEL", "pallas")
  want = greedy(True)
  assert not calls
  got = greedy(False, check=lambda s: isinstance(s.params["quantized"]["down"]["kernel"], NF4KMajor) or
               pytest.fail("the unrolled decoder kept the bnb layout"))
  assert {(128, 256), (128, 128), (128, 512), (256, 128)} == set(calls)  # q|k|v and gate|up: one product each
  np.testing.assert_array_equal(got, want)


@pytest.mark.fast
def test_the_measured_table_picks_per_bucket_and_falls_back():
  """kmajor_choice: the entry of m's bucket or the nearest smaller one; an fma entry only up to FMA_MAX_ROWS;
  an "xla" entry or m past DOT_MAX_ROWS: None; no entry: the default configuration; past DEFAULT_MAX_ROWS only
  an entry of a bucket past it. The committed table
  names a valid configuration for every entry."""
  from fineflax.quant.nf4_kernel_table import KMAJOR_TABLE_PATH, _read, kmajor_choice
  table = {"256x128/1": {"path": "fma", "bn": 128, "bkb": 32, "iters": 2},
           "256x128/16": {"path": "dot", "bn": 64, "bkb": 64, "iters": 2, "num_warps": 8},
           "256x128/64": {"path": "xla"}}
  assert kmajor_choice(256, 128, 1, table) == km.KMajorConfig(bn=128, bkb=32, iters=2)
  assert kmajor_choice(256, 128, 3, table) == km.KMajorConfig(bn=128, bkb=32, iters=2)
  assert kmajor_choice(256, 128, 5, table) == km.default_config(5, 256, 128)  # the fma entry stops at 4 rows
  assert kmajor_choice(256, 128, 20, table) == km.KMajorConfig(path="dot", bkb=64, iters=2, num_warps=8)
  assert kmajor_choice(256, 128, 33, table) is None and kmajor_choice(256, 128, 65, table) is None
  assert kmajor_choice(512, 128, 1, table) == km.default_config(1, 512, 128)
  rollout = {"256x128/16": {"path": "dot", "bkb": 64}, "256x128/128": {"path": "dot", "bkb": 32, "num_warps": 8}}
  assert kmajor_choice(256, 128, 100, rollout) == km.KMajorConfig(path="dot", bkb=32, num_warps=8)
  assert kmajor_choice(256, 128, 200, rollout) == km.KMajorConfig(path="dot", bkb=32, num_warps=8)
  assert kmajor_choice(256, 128, 60, rollout) == km.KMajorConfig(path="dot", bkb=64)
  assert kmajor_choice(256, 128, 100, {"256x128/16": {"path": "dot"}}) is None  # 16 rows' entry: not for 100
  eight = {"256x128/8": {"path": "fma", "bkb": 64, "iters": 1}}  # an fma entry measured at 8 rows serves 5-8
  assert kmajor_choice(256, 128, 7, eight) == km.KMajorConfig(bkb=64, iters=1)
  assert kmajor_choice(256, 128, 9, eight) == km.default_config(9, 256, 128)
  assert kmajor_choice(256, 128, km.DOT_MAX_ROWS + 1, rollout) is None
  prefill = {"256x128/256": {"path": "deq", "bn": 128}}  # past the largest bucket: only a deq entry serves
  assert kmajor_choice(256, 128, 4096, prefill) == km.KMajorConfig(path="deq", bn=128)
  assert kmajor_choice(256, 128, 200, prefill) == km.KMajorConfig(path="deq", bn=128)
  assert kmajor_choice(256, 128, 0, prefill) is None
  committed = _read(KMAJOR_TABLE_PATH)
  assert committed, "the committed nf4_kmajor_table.json is missing"
  for entry_key in committed:
    k, n = map(int, entry_key.split("/")[0].split("x"))
    m = int(entry_key.split("/")[1])
    cfg = kmajor_choice(k, n, m, committed)
    if cfg is not None:
      assert cfg.path in km.PATHS and (n % cfg.bn == 0) and (k // 2) % (cfg.bkb * cfg.iters) == 0, (entry_key, cfg)


@pytest.mark.fast
@pytest.mark.parametrize("path", ["fma", "dot", "dot_t", "deq"])
def test_the_shuffle_decode_lowers_for_cuda_and_the_gather_does_not_shuffle(path):
  """No GPU here: the kernel is lowered for CUDA (jax.export) and its Triton IR must hold the lane-id and
  warp-shuffle PTX of the "shfl" decode (interpreted, "shfl" runs the table gather), and none for "gather"."""
  from jax import export
  w = from_nf4(_weights((512, 128)))
  x = jnp.ones((1 if path == "fma" else 16, 512), jnp.bfloat16)
  texts = {}
  for decode in ("shfl", "gather"):
    cfg = km.KMajorConfig(path=path, decode=decode, bkb=64, iters=2)
    f = jax.jit(lambda x, w, cfg=cfg: km.kmajor_matmul(x, w, jnp.bfloat16, cfg))
    lowered = export.export(f, platforms=["cuda"], disabled_checks=[
        export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(x, w)
    texts[decode] = lowered.mlir_module()
  assert "shfl.sync.idx.b32" in texts["shfl"] and "%laneid" in texts["shfl"]
  assert "shfl.sync" not in texts["gather"] and "xla.gpu.triton" in texts["gather"]


@pytest.mark.fast
def test_pipelining_stages_reach_the_triton_call_and_are_swept():
  """KMajorConfig.num_stages is the Triton call's num_stages (lowered for CUDA); 0 is refused by name; the benchmark
  sweeps 2 and 3 stages where a program loops over several tiles, and never for one tile."""
  from jax import export
  from benchmarks.nf4_gemv import kmajor_candidates
  w = from_nf4(_weights((512, 128)))
  x = jnp.ones((16, 512), jnp.bfloat16)
  cfg = km.KMajorConfig(path="dot", bkb=64, iters=2, num_stages=3)
  f = jax.jit(lambda x, w: km.kmajor_matmul(x, w, jnp.bfloat16, cfg))
  text = export.export(f, platforms=["cuda"], disabled_checks=[
      export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(x, w).mlir_module()
  assert "num_stages = 3 : i32" in text and cfg.name().endswith(" s3")
  assert "num_stages and num_warps must be >= 1" in km.unsupported_reason(x.shape, w, km.KMajorConfig(num_stages=0))
  for m in (1, 16, 64):
    cands = kmajor_candidates(m, 4096, 14336)
    assert {c.num_stages for c in cands} == {1, 2, 3}, m
    assert all(c.iters > 1 for c in cands if c.num_stages > 1), m
