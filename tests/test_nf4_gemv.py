"""The fused NF4 kernel (`fineflax.quant.nf4_gemv`), run in Pallas' interpreter on CPU: its decoded values
bit for bit against bitsandbytes, its products against x @ W.dequantize() to bf16 rounding for every
variant, its shape rules, and the dispatch of `quantized_matmul` (FINEFLAX_NF4_KERNEL, the measured table)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.quant import nf4_gemv, nf4_kernel_table, quantize_nf4
from fineflax.quant.matmul import kernel_config, quantized_matmul
from fineflax.quant.nf4_gemv import KernelConfig


def _case(m, k, n, double_quant=True, seed=0, x_dtype=jnp.bfloat16):
  rng = np.random.default_rng(seed)
  w = quantize_nf4(jnp.asarray(rng.standard_normal((k, n)) * 0.02, jnp.float32), 64, double_quant)
  x = jnp.asarray(rng.standard_normal((m, k)), x_dtype)
  return x, w


def _reference(x, w, dtype=jnp.bfloat16):
  return np.asarray(jnp.matmul(x, w.dequantize(dtype), preferred_element_type=jnp.float32,
                               precision=jax.lax.Precision.HIGHEST), np.float32)


def _close(got, want, x_dtype):
  """Within one rounding of the output dtype; near 0 within f32 sums in another order (1e-5 of the largest)."""
  rtol = 2 ** -8 if x_dtype == jnp.bfloat16 else 1e-5
  np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=rtol, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("double_quant", [pytest.param(True, marks=pytest.mark.fast), False])
def test_decoded_values_equal_bitsandbytes_bit_for_bit(double_quant):
  """x = the identity (f32) makes the kernel's product its decoded W: equal to bnb.functional.dequantize_4bit
  of the same codes and (nested) scales, bit for bit, through both decode methods and both scale paths."""
  torch = pytest.importorskip("torch")
  F = pytest.importorskip("bitsandbytes.functional")
  from fineflax.quant.blockwise import dynamic_code
  from fineflax.quant.nf4 import NF4_CODE
  k, n = 32, 640  # 10 x 32 blocks: nested groups of 256 blocks straddle rows
  _, w = _case(1, k, n, double_quant, seed=3)
  state2 = None
  absmax = torch.from_numpy(np.array(w.absmax))
  if double_quant:
    state2 = F.QuantState(absmax=torch.from_numpy(np.array(w.absmax_scale)), code=torch.from_numpy(dynamic_code()),
                          blocksize=256, dtype=torch.float32)
  state = F.QuantState(absmax=absmax, shape=torch.Size((k, n)), dtype=torch.float32, blocksize=64,
                       code=torch.from_numpy(NF4_CODE), quant_type="nf4", state2=state2,
                       offset=torch.tensor(float(w.absmax_offset)) if double_quant else None)
  want = F.dequantize_4bit(torch.from_numpy(np.asarray(w.codes).copy()).reshape(-1, 1), state).numpy()
  eye = jnp.eye(k, dtype=jnp.float32)
  for cfg in (KernelConfig(decode="gather", bm=32, bn=128, bk=16, split_k=2),
              KernelConfig(decode="select", scales="f32", bm=32, bn=128, bk=32)):
    got = np.asarray(nf4_gemv.nf4_matmul(eye, w, jnp.float32, cfg, interpret=True))
    np.testing.assert_array_equal(got, want, err_msg=cfg.name())


PRODUCT_CASES = [  # (m, k, n, x dtype, config)
    (1, 256, 128, jnp.bfloat16, None),
    (3, 512, 192, jnp.float32, KernelConfig(path="fma", bm=4, bn=64, bk=64, split_k=2)),
    (64, 256, 256, jnp.bfloat16, KernelConfig(bm=32, bn=128, bk=64, split_k=2)),
    (257, 128, 64, jnp.bfloat16, KernelConfig(decode="select", scales="f32", bm=64, bn=64, bk=128)),
    (5, 384, 320, jnp.float32, KernelConfig(decode="select", bm=16, bn=64, bk=32, split_k=3)),
]


@pytest.mark.fast
@pytest.mark.parametrize("m,k,n,x_dtype,cfg", PRODUCT_CASES[:2])
def test_products_equal_the_dequantised_product_fast(m, k, n, x_dtype, cfg):
  _check_product(m, k, n, x_dtype, cfg)


@pytest.mark.parametrize("m,k,n,x_dtype,cfg", PRODUCT_CASES[2:])
def test_products_equal_the_dequantised_product(m, k, n, x_dtype, cfg):
  """M = 1, 3, 64, 257 (tiled by bm, padded), odd N (192, 320: 3 and 5 blocks a row), K = 384 split in 3;
  gather and select decodes, dot and FMA paths, f32 and bf16 activations: within the output's rounding."""
  _check_product(m, k, n, x_dtype, cfg)


def _check_product(m, k, n, x_dtype, cfg):
  x, w = _case(m, k, n, x_dtype=x_dtype, seed=m)
  dtype = x_dtype
  got = nf4_gemv.nf4_matmul(x, w, dtype, cfg, interpret=True)
  want = _reference(x, w, dtype)
  assert got.shape == (m, n) and got.dtype == x_dtype
  _close(got, want, x_dtype)
  # columns interleave as the codes do: a wrong even/odd order fails far beyond rounding
  swapped = np.asarray(got, np.float32).reshape(m, n // 2, 2)[..., ::-1].reshape(m, n)
  assert np.abs(swapped - want).max() > 50 * 2 ** -8 * np.abs(want).max()


@pytest.mark.fast
def test_unsupported_input_raises_a_clear_error():
  x, w = _case(2, 256, 96)
  with pytest.raises(ValueError, match=r"N=96 is not a multiple of bn=64"):
    nf4_gemv.nf4_matmul(x, w, interpret=True)
  x, w = _case(2, 256, 64)
  with pytest.raises(ValueError, match=r"K=256 is not a multiple of bk \* split_k = 128 \* 3"):
    nf4_gemv.nf4_matmul(x, w, cfg=KernelConfig(bn=64, split_k=3), interpret=True)
  with pytest.raises(ValueError, match=r"x of shape \(2, 128\) for W \[K=256, N=64\]"):
    nf4_gemv.nf4_matmul(x[:, :128], w, interpret=True)
  with pytest.raises(ValueError, match=r"KernelConfig.bm=8: a power of 2 \(>= 16 for path 'dot'\)"):
    nf4_gemv.nf4_matmul(x, w, cfg=KernelConfig(bm=8, bn=64), interpret=True)
  with pytest.raises(ValueError, match=r"KernelConfig.decode='lut'"):
    nf4_gemv.nf4_matmul(x, w, cfg=KernelConfig(decode="lut"), interpret=True)
  stacked = quantize_nf4(jnp.zeros((2, 256, 64), jnp.float32) + 0.1, 64, True, lead_dims=1)
  assert "leading axes (2,)" in nf4_gemv.unsupported_reason((2, 256), stacked, KernelConfig())
  block128 = quantize_nf4(jnp.ones((256, 128), jnp.float32), 128, True)
  assert nf4_gemv.unsupported_reason((2, 256), block128, KernelConfig()) == "NF4 blocksize=128; the kernel needs 64"


def _table_for(k, n, m, **fields):
  cfg = dict(dataclasses.asdict(KernelConfig(bm=16, bn=64, bk=64)), **fields)
  return {nf4_kernel_table.key(k, n, nf4_kernel_table.bucket(m)): cfg}


@pytest.mark.fast
def test_auto_choice_is_xla_on_cpu_and_the_tables_pick_on_gpu(monkeypatch):
  """auto: XLA on a CPU backend even where the table has an entry; on a (faked) GPU backend the table's
  config for (K, N, M bucket), and XLA for shapes or buckets it lacks; xla / pallas force; a bad value errs."""
  x, w = _case(6, 256, 128)
  table = _table_for(256, 128, 6, split_k=2)
  monkeypatch.setattr(nf4_kernel_table, "load_table", lambda path=None: table)
  monkeypatch.delenv("FINEFLAX_NF4_KERNEL", raising=False)
  assert jax.default_backend() == "cpu" and kernel_config(6, w, jnp.bfloat16, jnp.bfloat16) is None
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert kernel_config(6, w, jnp.bfloat16, jnp.bfloat16) == KernelConfig(bm=16, bn=64, bk=64, split_k=2)
  assert kernel_config(7, w, jnp.float32, jnp.float32).split_k == 2  # same bucket (8)
  # bucket 16 is not in the table: the bucket-8 entry serves, its 16 rows cover 9 in one tile
  assert kernel_config(9, w, jnp.bfloat16, jnp.bfloat16) == KernelConfig(bm=16, bn=64, bk=64, split_k=2)
  assert kernel_config(40, w, jnp.bfloat16, jnp.bfloat16).bm == 64
  assert kernel_config(6, _case(6, 256, 192)[1], jnp.bfloat16, jnp.bfloat16) is None  # another shape
  monkeypatch.setenv("FINEFLAX_NF4_KERNEL", "xla")
  assert kernel_config(6, w, jnp.bfloat16, jnp.bfloat16) is None
  monkeypatch.setenv("FINEFLAX_NF4_KERNEL", "pallas")
  assert kernel_config(9, w, jnp.bfloat16, jnp.bfloat16) == nf4_gemv.default_config(9)
  monkeypatch.setenv("FINEFLAX_NF4_KERNEL", "fast")
  with pytest.raises(ValueError, match=r"FINEFLAX_NF4_KERNEL='fast'; expected one of \('auto', 'pallas', 'xla'\)"):
    kernel_config(6, w, jnp.bfloat16, jnp.bfloat16)


@pytest.mark.fast
def test_quantized_matmul_runs_the_tables_kernel_with_its_gradient(monkeypatch):
  """On a faked GPU the table's kernel (interpreted) computes a [2, 3, K] product, flattened to 6 rows; the
  value equals the dequantised product and dx (always dequantised) equals the plain product's."""
  calls = []
  kernel = nf4_gemv.nf4_matmul
  monkeypatch.setattr(nf4_gemv, "nf4_matmul", lambda x, w, d, cfg, interpret: calls.append(
      (x.shape, cfg.split_k)) or kernel(x, w, d, cfg, interpret=True))
  monkeypatch.setattr(nf4_kernel_table, "load_table", lambda path=None: _table_for(256, 128, 6, split_k=2))
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.delenv("FINEFLAX_NF4_KERNEL", raising=False)
  x, w = _case(6, 256, 128)
  got = quantized_matmul(x.reshape(2, 3, 256), w, jnp.bfloat16)
  assert got.shape == (2, 3, 128) and calls == [((6, 256), 2)]
  _close(got.reshape(6, 128), _reference(x, w), jnp.bfloat16)
  x32 = x.astype(jnp.float32)
  dx = jax.grad(lambda v: quantized_matmul(v, w, jnp.float32).sum())(x32)
  want = jax.grad(lambda v: (v @ w.dequantize(jnp.float32)).sum())(x32)
  np.testing.assert_allclose(np.asarray(dx), np.asarray(want), rtol=1e-6)


def test_table_json_round_trip(tmp_path):
  """A written table loads back to the same configs; smaller buckets' entries serve larger M (rows raised);
  M above the largest bucket, or FMA entries for M > FMA_MAX_ROWS, are XLA."""
  import json
  path = tmp_path / "t.json"
  entries = _table_for(512, 256, 40, decode="select", bk=32)
  path.write_text(json.dumps({"device": "test", "entries": entries}))
  table = nf4_kernel_table.load_table(str(path))
  assert nf4_kernel_table.kernel_choice(512, 256, 33, table) == KernelConfig(decode="select", bm=64, bn=64, bk=32)
  assert nf4_kernel_table.kernel_choice(512, 256, 257, table) is None
  assert nf4_kernel_table.kernel_choice(512, 256, 1, table) is None  # no entry at or below bucket 1
  fma = _table_for(512, 256, 1, path="fma", bm=1)  # measured at M = 1: serves M <= 4 with bm = pow2(M)
  assert nf4_kernel_table.FMA_MAX_ROWS == 4
  assert nf4_kernel_table.kernel_choice(512, 256, 3, fma) == KernelConfig(path="fma", bm=4, bn=64, bk=64)
  assert nf4_kernel_table.kernel_choice(512, 256, 5, fma) is None
  # benchmarks/nf4_gemv: a later run into the same --out keeps an earlier run's entries of the same device only
  from benchmarks.nf4_gemv import _entries
  assert _entries(path, "test") == entries and _entries(path, "gpu: other") == {}
  assert _entries(tmp_path / "missing.json", "test") == {}


@pytest.mark.fast
def test_a_layer_of_a_stacked_kernel_is_read_in_place():
  """`NF4Layer(stacked, i)`: the kernel's product equals layer i's sliced product (both scale paths), and
  the view dequantises to the slice; a bad layer index is a clear error."""
  from fineflax.quant.nf4_layer import NF4Layer
  rng = np.random.default_rng(5)
  stacked = quantize_nf4(jnp.asarray(rng.standard_normal((3, 128, 128)) * 0.02, jnp.float32), 64, True, lead_dims=1)
  x = jnp.asarray(rng.standard_normal((2, 128)), jnp.float32)
  view = NF4Layer(stacked, 2)
  sliced = jax.tree.map(lambda a: a[2], stacked)
  np.testing.assert_array_equal(np.asarray(view.dequantize(jnp.float32)), np.asarray(sliced.dequantize(jnp.float32)))
  for scales in ("kernel", "f32"):
    cfg = KernelConfig(path="fma", scales=scales, bm=2, bn=64, bk=64)
    got = nf4_gemv.nf4_matmul(x, view, jnp.float32, cfg, interpret=True)
    _close(got, _reference(x, sliced, jnp.float32), jnp.float32)
  with pytest.raises(ValueError, match=r"NF4Layer: layer=3 outside \[0, 3\)"):
    NF4Layer(stacked, 3)


@pytest.mark.parametrize("impl", ["unrolled", "scan"])
def test_greedy_nf4_decode_through_the_kernel_equals_the_dequantised_forward(monkeypatch, impl):
  """A tiny random NF4 Llama (f32): greedy tokens decoded with every linear product through the kernel
  (FINEFLAX_NF4_KERNEL=pallas, interpreted; unrolled: layer views read in place, scan: sliced layers) equal
  those of the same session decoding the dequantised weights (dense_base=True), and the kernel ran."""
  from tests._sampling_fixtures import nf4_greedy_case
  greedy = nf4_greedy_case(impl)
  calls = []
  kernel = nf4_gemv.nf4_matmul
  monkeypatch.setattr(nf4_gemv, "nf4_matmul", lambda *a, **kw: calls.append(a[1].shape) or kernel(*a, **kw))
  monkeypatch.setenv("FINEFLAX_NF4_KERNEL", "pallas")
  monkeypatch.setenv("FINEFLAX_NF4_LAYOUT", "bnb")  # the bnb-layout kernel (tests/test_nf4_kmajor.py: K-major)
  want = greedy(True)
  assert not calls
  got = greedy(False)
  assert {(128, 128), (128, 64), (128, 256), (256, 128)} <= set(calls)
  np.testing.assert_array_equal(got, want)


def test_decode_weights_names_an_unknown_one():
  """benchmarks/nf4_gemv --weights: known names pass in order; an unknown or empty list is a ValueError naming it."""
  from benchmarks._nf4_decode import decode_weights
  assert decode_weights("bf16,nf4-auto") == ["bf16", "nf4-auto"]
  with pytest.raises(ValueError, match="nf4-fast"):
    decode_weights("bf16,nf4-fast")
  with pytest.raises(ValueError, match="empty"):
    decode_weights(",")


@pytest.mark.slow
def test_the_products_benchmark_smoke_checks_every_kernel_path_and_adds_to_an_earlier_table(tmp_path):
  """`python -m benchmarks.nf4_gemv --smoke --only products` (CPU, interpreted): every variant of both kernels
  (the K-major fma / dot / dot_t / deq paths included) runs and matches XLA's product; an entry an earlier run
  of the same device left in --out's K-major table is kept."""
  import json
  import subprocess
  import sys
  earlier = {"device": "cpu: cpu", "entries": {"999x64/1": {"path": "xla", "us": 1.0, "xla_us": 1.0}}}
  (tmp_path / "nf4_kmajor_table.json").write_text(json.dumps(earlier))
  proc = subprocess.run([sys.executable, "-m", "benchmarks.nf4_gemv", "--smoke", "--only", "products", "--out",
                         str(tmp_path)], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = json.loads((tmp_path / "nf4_gemv.json").read_text())["rows"]
  assert not [r for r in rows if "error" in r]
  kernels = [r for r in rows if r["variant"] not in ("xla", "bf16 W")]
  assert {p for r in kernels for p in ("fma", "dot", "dot_t", "deq") if f"/{p} " in r["variant"]} == {
      "fma", "dot", "dot_t", "deq"}
  assert all(r["max_rel_err"] < 2 ** -6 for r in kernels), [(r["variant"], r["max_rel_err"]) for r in kernels]
  ktable = json.loads((tmp_path / "nf4_kmajor_table.json").read_text())
  device = json.loads((tmp_path / "nf4_gemv.json").read_text())["device"]
  assert ("999x64/1" in ktable["entries"]) == (device == earlier["device"]), (device, list(ktable["entries"]))
  assert any(key.startswith("256x128/") for key in ktable["entries"])
