"""y = x @ W for an NF4 kernel W and few rows x (decoding): one Pallas (Triton) kernel that reads the 4-bit codes.

XLA does not fuse NF4 dequantisation into a matmul (benchmarks/RESULTS.md, section nf4_dequant): `x @
W.dequantize()` writes the dense bf16 W and reads it back, 4.5 bytes a weight against 2 for a bf16 kernel.
Here each program decodes one tile of codes in registers and multiplies it at once (0.5 bytes a weight plus
1/16 for the scales). Measured on an H200 (section nf4_gemv) it runs at XLA's speed, not at the bytes'
bound: decoding the codes (a 15-select tree a weight) is what both spend their time on, so it is opt-in
(`quantized_matmul`, FINEFLAX_NF4_KERNEL=pallas).

  W [K, N] row-major, element e = k N + n; codes byte j = (q[2j] << 4) | q[2j + 1]; block b = e // 64
  tile (kk, j): rows k in [kk BK, (kk + 1) BK), code columns [32 j, 32 j + 32) = outputs n in [64 j, 64 j + 64),
  one absmax a[k, j] a row (the tile's 64 outputs of row k are one block):
    W[k, 64 j + 2 c]     = NF4[codes[k, 32 j + c] >> 4]  * a[k, j]     (even outputs, high nibbles)
    W[k, 64 j + 2 c + 1] = NF4[codes[k, 32 j + c] & 15]  * a[k, j]     (odd outputs, low nibbles)
  partial[kk, m, n] = sum_{k in tile rows} x[m, k] bf16(W[k, n])  (f32 accumulation); y = sum_kk partial.

W's values are those of `NF4Tensor.dequantize(bf16)` (f32 product, then bf16), so y equals x @
W.dequantize() up to the order of the f32 sums. Supports block size 64, N % 64 == 0, K % BK == 0 and at
most MAX_ROWS rows (padded to a multiple of 16); `supported` says whether a product qualifies.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fineflax.quant.nf4 import NF4_CODE, NF4Tensor

MAX_ROWS = 64  # above this the product is compute-bound: dequantise once and use the GEMM
BK = 256  # rows of W per program


def supported(x_rows: int, w) -> bool:
  """Whether `nf4_matmul` takes x [x_rows, K] @ w: an unstacked NF4 [K, N], block 64, the shape rules above."""
  if not isinstance(w, NF4Tensor) or w.lead_shape or len(w.shape) != 2 or w.blocksize != 64:
    return False
  k, n = w.shape
  return 0 < x_rows <= MAX_ROWS and n % 64 == 0 and k % BK == 0


def _nf4_values(q):
  """NF4[q] for int32 codes q in [0, 16) as a select tree on q's bits (Triton has no table gather)."""
  code = [float(v) for v in np.asarray(NF4_CODE, np.float32)]
  def pick(bit, lo, hi):
    return jnp.where((q & bit) != 0, hi, lo)
  level = [jnp.float32(v) for v in code]
  for bit in (1, 2, 4, 8):
    level = [pick(bit, level[i], level[i + 1]) for i in range(0, len(level), 2)]
  return level[0]


def _kernel(x_ref, codes_ref, scale_ref, even_ref, odd_ref):
  codes = codes_ref[...].astype(jnp.int32)  # [BK, 32]
  scale = scale_ref[...]  # [BK, 1] f32
  x = x_ref[...]  # [Mp, BK] bf16
  for q, out_ref in (((codes >> 4) & 15, even_ref), (codes & 15, odd_ref)):
    w = (_nf4_values(q) * scale).astype(x.dtype)
    out_ref[...] = jnp.dot(x, w, preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnames=("interpret",))
def nf4_matmul(x: jnp.ndarray, w: NF4Tensor, interpret: bool = False) -> jnp.ndarray:
  """x [M, K] (bf16 or f32) @ w (NF4 [K, N]) -> [M, N] of x's dtype; needs `supported(M, w)`.

  interpret=True runs the kernel in Pallas' interpreter (any backend; for tests).
  """
  from jax.experimental import pallas as pl

  m, k = x.shape
  if not supported(m, w) or k != w.shape[0]:
    raise ValueError(f"nf4_matmul: x {x.shape} @ NF4 {w.shape} (block {w.blocksize}, leading "
                     f"{w.lead_shape}) is outside its rules (see fineflax.quant.nf4_gemv)")
  n = w.shape[1]
  mp = -(-m // 16) * 16
  xp = jnp.pad(x, ((0, mp - m), (0, 0)))
  codes = w.codes.reshape(k, n // 2)
  scale = w.absmax_f32().reshape(k, n // 64)
  grid = (n // 64, k // BK)
  half = jax.ShapeDtypeStruct((k // BK, mp, n // 2), jnp.float32)
  out_spec = pl.BlockSpec((None, mp, 32), lambda j, kk: (kk, 0, j))
  even, odd = pl.pallas_call(
      _kernel, out_shape=(half, half), grid=grid,
      in_specs=[pl.BlockSpec((mp, BK), lambda j, kk: (0, kk)),
                pl.BlockSpec((BK, 32), lambda j, kk: (kk, j)),
                pl.BlockSpec((BK, 1), lambda j, kk: (kk, j))],
      out_specs=(out_spec, out_spec), interpret=interpret)(xp, codes, scale)
  y = jnp.stack([even.sum(0), odd.sum(0)], axis=-1).reshape(mp, n)  # interleave: n = 2 c (+ 1)
  return y[:m].astype(x.dtype)
