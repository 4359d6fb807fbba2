"""Block-wise absmax quantisation onto a sorted code book, as bitsandbytes' reference kernels compute it.

For a flat f32 vector x cut into blocks of `blocksize` (a short last block is its own block):
  absmax_b = max_{i in b} |x_i|,
  s_i = clip(x_i * (1 / absmax_b), -1, 1)   (x_i / absmax_b in a short last block),
  q_i = #{k : mid_k < s_i},  mid_k = (code_k + code_{k+1}) / 2   (nearest code, ties to the lower one),
  x_i ~ code[q_i] * absmax_b.
This is `bitsandbytes/backends/default/ops.py` (`quantize_4bit`, `quantize_blockwise`: `torch.bucketize` on
the midpoints). bnb's x86 CPU C kernel for 8-bit instead looks codes up in a 65536-entry table, which can
differ from the nearest code within 2/65535 of a midpoint; CUDA uses a binary search to the same nearest code.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

_F32_TINY = np.float32(np.finfo(np.float32).tiny)  # smallest normal f32, 2^-126
_BNB_ABSMAX_FLOOR = np.float32(1e-38)  # bnb's clamp(min=1e-38), a subnormal


def _linspace_f32(n: int) -> np.ndarray:
  """torch.linspace(0.1, 1, n, dtype=float32) bit for bit (f32 step, one fused multiply-add per element)."""
  start, end = np.float32(0.1), np.float32(1.0)
  step = np.float64(np.float32((end - start) / np.float32(n - 1)))
  idx = np.arange(n)
  lo = np.float64(start) + step * idx
  hi = np.float64(end) - step * (n - 1 - idx)
  return np.where(idx < n // 2, lo, hi).astype(np.float32)


@functools.lru_cache(maxsize=None)
def dynamic_code() -> np.ndarray:
  """bitsandbytes `create_dynamic_map(signed=True)` (7 exponent bits, 8 bits): f32 [256], sorted.

  For exponent i in 0..6, the 2^i midpoints m of linspace(0.1, 1, 2^i + 1) give +-10^(i-6) * m (f32);
  plus 0 and 1.
  """
  values = [np.float32(0.0), np.float32(1.0)]
  for i in range(7):
    bounds = _linspace_f32(2 ** i + 1)
    means = (bounds[:-1] + bounds[1:]) / np.float32(2.0)
    values += list(np.float32(10.0 ** (i - 6)) * means) + list(np.float32(-(10.0 ** (i - 6))) * means)
  return np.sort(np.asarray(values, np.float32))


def scale_blocks(x: jnp.ndarray, blocksize: int) -> tuple[jnp.ndarray, jnp.ndarray]:
  """x [n] -> (s f32 [nblocks, blocksize] in [-1, 1], absmax f32 [nblocks]); the tail is zero-padded.

  bnb divides by max(absmax, 1e-38) and stores absmax unclamped, except for a short last block, whose
  stored absmax is clamped to 1e-38. 1e-38 is subnormal: XLA flushes it to 0 (0 * (1 / 0) = NaN, code 0),
  so a block whose absmax is 0 (or subnormal) is scaled by 1 here instead: its s is exactly 0 (the zero
  code) as in bnb, and the clamp for the short block is a select of the constant's bits.
  """
  n = x.shape[0]
  nblocks = -(-n // blocksize)
  x = jnp.pad(x.astype(jnp.float32), (0, nblocks * blocksize - n)).reshape(nblocks, blocksize)
  absmax = jnp.max(jnp.abs(x), axis=-1)
  normal = absmax >= _F32_TINY  # False for 0 and for subnormals (flushed to 0 by XLA anyway)
  am = jnp.where(normal, absmax, 1.0)[:, None]
  s = x * (1.0 / am)
  if n % blocksize:  # bnb divides (rather than multiplies by the reciprocal) in a short last block
    s = s.at[-1].set(x[-1] / am[-1])
    absmax = absmax.at[-1].set(jnp.where(normal[-1], absmax[-1], _BNB_ABSMAX_FLOOR))
  return jnp.clip(s, -1.0, 1.0), absmax


def nearest_code(s: jnp.ndarray, code: np.ndarray) -> jnp.ndarray:
  """Index (uint8) of the nearest entry of the sorted `code`, ties to the lower index (bucketize, left)."""
  code = np.asarray(code, np.float32)
  mid = jnp.asarray((code[:-1] + code[1:]) / np.float32(2.0))
  return jnp.sum(s[..., None] > mid, axis=-1).astype(jnp.uint8)


def quantize_blockwise8(x: jnp.ndarray, blocksize: int) -> tuple[jnp.ndarray, jnp.ndarray]:
  """x f32 [n] -> (q uint8 [n], absmax f32 [ceil(n / blocksize)]) on `dynamic_code()`."""
  s, absmax = scale_blocks(x, blocksize)
  return nearest_code(s, dynamic_code()).reshape(-1)[:x.shape[0]], absmax


def rounded(x: jnp.ndarray) -> jnp.ndarray:
  """x itself, as a select the compiler cannot see through: a product passed through it is rounded to f32
  before a following add (no fused multiply-add contraction, whatever the fusion), as bitsandbytes rounds."""
  return jnp.where(jnp.isnan(x), jnp.asarray(jnp.nan, x.dtype), x)


def dequantize_blockwise8(q: jnp.ndarray, absmax: jnp.ndarray, n: int, blocksize: int) -> jnp.ndarray:
  """Inverse over any leading axes: q [..., n], absmax [..., B] -> f32 [..., n]."""
  lead, nblocks = q.shape[:-1], absmax.shape[-1]
  pad = nblocks * blocksize - n
  values = jnp.asarray(dynamic_code())[q.astype(jnp.int32)]
  if pad:
    values = jnp.pad(values, [(0, 0)] * len(lead) + [(0, pad)])
  x = values.reshape(*lead, nblocks, blocksize) * absmax[..., None]
  return x.reshape(*lead, -1)[..., :n]
