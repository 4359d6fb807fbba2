"""The fused NF4 kernel for few-row products (`fineflax.quant.nf4_gemv`), run in Pallas' interpreter on CPU:
equal to x @ W.dequantize(bf16) up to bf16 rounding of the output, its shape rules, and the dispatch of
`quantized_matmul` to it (GPU backend, bf16, few rows, FINEFLAX_NF4_KERNEL=pallas)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.quant import nf4_gemv, quantize_nf4
from fineflax.quant.matmul import quantized_matmul

pytestmark = pytest.mark.fast


def _case(m, k, n, double_quant=True, seed=0):
  rng = np.random.default_rng(seed)
  w = quantize_nf4(jnp.asarray(rng.standard_normal((k, n)) * 0.02, jnp.float32), 64, double_quant)
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  return x, w


def _reference(x, w):
  return np.asarray(jnp.matmul(x, w.dequantize(jnp.bfloat16), preferred_element_type=jnp.float32))


@pytest.mark.parametrize("m,k,n,double_quant", [(1, 256, 64, True), (17, 512, 192, False)])
def test_kernel_equals_dequantised_product(m, k, n, double_quant):
  """M = 1 and M = 17 (padded to 32), one and two K tiles, one and three column tiles, with and without
  double quantisation: within one bf16 rounding of the f32 product (the kernel's output dtype is x's)."""
  x, w = _case(m, k, n, double_quant)
  got = nf4_gemv.nf4_matmul(x, w, interpret=True)
  want = _reference(x, w)
  assert got.shape == (m, n) and got.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2 ** -8, atol=1e-6)
  # columns interleave as the codes do: a wrong even/odd order fails far beyond rounding
  swapped = np.asarray(got, np.float32).reshape(m, n // 2, 2)[..., ::-1].reshape(m, n)
  assert np.abs(swapped - want).max() > 50 * 2 ** -8 * np.abs(want).max()


def test_supported_shapes_and_the_error_outside_them():
  x, w = _case(1, 256, 64)
  assert nf4_gemv.supported(1, w) and nf4_gemv.supported(nf4_gemv.MAX_ROWS, w)
  assert not nf4_gemv.supported(nf4_gemv.MAX_ROWS + 1, w)
  stacked = quantize_nf4(jnp.zeros((2, 256, 64), jnp.float32) + 0.1, 64, True, lead_dims=1)
  assert not nf4_gemv.supported(1, stacked)
  assert not nf4_gemv.supported(1, quantize_nf4(jnp.ones((256, 96), jnp.float32), 64, True))  # N % 64
  assert not nf4_gemv.supported(1, quantize_nf4(jnp.ones((128, 64), jnp.float32), 64, True))  # K % BK
  assert not nf4_gemv.supported(1, quantize_nf4(jnp.ones((256, 128), jnp.float32), 128, True))  # block 128
  with pytest.raises(ValueError, match=r"nf4_matmul: x \(65, 256\) @ NF4 \(256, 64\)"):
    nf4_gemv.nf4_matmul(jnp.zeros((65, 256), jnp.bfloat16), w, interpret=True)


@pytest.mark.parametrize("setting,fused", [("pallas", True), ("xla", False), (None, False)])
def test_quantized_matmul_dispatches_few_bf16_rows_on_gpu(monkeypatch, setting, fused):
  """On a GPU backend (faked here, the kernel interpreted) with FINEFLAX_NF4_KERNEL=pallas a [2, 3, K] bf16
  input takes the kernel, flattened to 6 rows; not with =xla or unset (the default); values equal the
  dequantised product either way."""
  calls = []
  kernel = functools.partial(nf4_gemv.nf4_matmul, interpret=True)
  monkeypatch.setattr(nf4_gemv, "nf4_matmul", lambda x, w: calls.append(x.shape) or kernel(x, w))
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  if setting is None:
    monkeypatch.delenv("FINEFLAX_NF4_KERNEL", raising=False)
  else:
    monkeypatch.setenv("FINEFLAX_NF4_KERNEL", setting)
  x, w = _case(6, 256, 128)
  got = quantized_matmul(x.reshape(2, 3, 256), w, jnp.bfloat16)
  assert got.shape == (2, 3, 128)
  assert calls == ([(6, 256)] if fused else [])
  np.testing.assert_allclose(np.asarray(got, np.float32).reshape(6, 128), _reference(x, w), rtol=2 ** -8, atol=1e-6)
