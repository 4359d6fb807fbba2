"""An NF4 kernel W [K, N] re-laid out for decoding: each output's codes contiguous along K.

bitsandbytes' layout (`NF4Tensor`) flattens W row-major, so a product's reduction axis K is strided through
the codes. Here, for an `NF4Tensor` with blocksize 64 and N % 64 == 0 (every block = 64 outputs of one row k):

  codes  uint8 [..., N, K/2]       byte (n, j) = (q[2j, n] << 4) | q[2j + 1, n]
  scale_even / scale_odd  f32 [..., N/64, K/2]   a[2j, g], a[2j + 1, g]: the block scales of rows 2j / 2j + 1
                                                 and output group g (double quantisation decoded once)
  W[k, n] = dtype(NF4[q[k, n]] * a[k, n // 64])   (the same f32 product as `NF4Tensor.dequantize`)

A permutation of the codes and of the decoded scales: `from_nf4(w).dequantize(d) == w.dequantize(d)` bit for
bit. 4 + 32/64 = 4.5 bits a weight (f32 scales). Outputs concatenate: `from_nf4_concat([W_1, W_2])` is the
K-major [W_1 | W_2] (codes and scales side by side along N), one product for a fused q|k|v or gate|up. The
fused kernel `nf4_kmajor_gemv` reduces each output's K range inside one thread's registers; `dequantize` is
XLA's path (its transpose fuses into the consumer dot).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from fineflax.quant.nf4 import NF4_CODE, NF4Tensor


@struct.dataclass
class NF4KMajor:
  """NF4 W [K, N] (`shape`), its leaves with any leading (stacked-layer) axes; see the module docstring."""
  codes: jax.Array
  scale_even: jax.Array
  scale_odd: jax.Array
  shape: tuple[int, int] = struct.field(pytree_node=False)
  dtype: Any = struct.field(pytree_node=False)

  @property
  def lead_shape(self) -> tuple[int, ...]:
    return tuple(self.codes.shape[:-2])

  @classmethod
  def abstract(cls, k: int, n: int, dtype=jnp.bfloat16) -> "NF4KMajor":
    """An unstacked W [k, n] of shapes only (`jax.ShapeDtypeStruct` leaves), for shape rules and eval_shape."""
    scales = jax.ShapeDtypeStruct((n // 64, k // 2), jnp.float32)
    return cls(codes=jax.ShapeDtypeStruct((n, k // 2), jnp.uint8), scale_even=scales, scale_odd=scales,
               shape=(k, n), dtype=dtype)

  def dequantize(self, dtype=None) -> jnp.ndarray:
    """Dense [..., K, N] of `dtype` (default: the dtype it was quantised from)."""
    dtype = self.dtype if dtype is None else dtype
    k, n = self.shape
    table = jnp.asarray(NF4_CODE)
    hi, lo = table[(self.codes >> 4).astype(jnp.int32)], table[(self.codes & 15).astype(jnp.int32)]
    rep = lambda s: jnp.repeat(s, 64, axis=-2)  # [..., N, K/2]
    w = jnp.stack([hi * rep(self.scale_even), lo * rep(self.scale_odd)], axis=-1).reshape(*self.lead_shape, n, k)
    return jnp.swapaxes(w.astype(dtype), -1, -2)


def kmajor_reason(w) -> str | None:
  """None when `from_nf4(w)` applies, else a one-line reason naming the value at fault."""
  if not isinstance(w, NF4Tensor) or len(w.shape) != 2:
    return f"{type(w).__name__} of shape {getattr(w, 'shape', None)}: an NF4 kernel [K, N] needed"
  k, n = w.shape
  if w.blocksize != 64 or n % 64 or k % 2:
    return f"NF4 [K={k}, N={n}] blocksize {w.blocksize}: K even, N % 64 == 0 and blocksize 64 needed"
  return None


@jax.jit
def from_nf4(w: NF4Tensor) -> NF4KMajor:
  """`w` (stacked leading axes allowed; converted one tensor at a time) in the K-major layout, exactly
  (module docstring). ValueError unless `kmajor_reason(w)` is None."""
  reason = kmajor_reason(w)
  if reason:
    raise ValueError(f"from_nf4: {reason}")
  if w.lead_shape:
    return jax.lax.map(from_nf4, w)
  k, n = w.shape
  q = jnp.stack([w.codes >> 4, w.codes & 15], axis=-1).reshape(k // 2, 2, n)  # q[2j + e, n]
  codes = (q[:, 0] << 4) | q[:, 1]                                            # [K/2, N]
  scales = jnp.swapaxes(w.absmax_f32().reshape(k // 2, 2, n // 64), 0, 2)    # [N/64, 2, K/2]
  return NF4KMajor(codes=codes.T, scale_even=scales[:, 0], scale_odd=scales[:, 1], shape=(k, n), dtype=w.dtype)


def concat_reason(ws) -> str | None:
  """None when `from_nf4_concat(ws)` applies, else a one-line reason naming the tensor at fault."""
  if not ws:
    return "no tensors to concatenate"
  for i, w in enumerate(ws):
    reason = kmajor_reason(w) if isinstance(w, NF4Tensor) and len(w.lead_shape) <= 1 else (
        f"{type(w).__name__} with leading axes {getattr(w, 'lead_shape', None)}: an NF4Tensor with at most one")
    if reason is None and (w.shape[0], w.lead_shape, w.dtype) != (ws[0].shape[0], ws[0].lead_shape, ws[0].dtype):
      reason = (f"K={w.shape[0]}, leading axes {w.lead_shape}, dtype {jnp.dtype(w.dtype).name} differ from tensor "
                f"0's K={ws[0].shape[0]}, {ws[0].lead_shape}, {jnp.dtype(ws[0].dtype).name}")
    if reason:
      return f"tensor {i}: {reason}"
  return None


@jax.jit
def from_nf4_concat(ws: tuple[NF4Tensor, ...]) -> NF4KMajor:
  """The K-major copy of [W_1 | ... | W_n] (each [K, N_i], concatenated along the outputs N): `from_nf4(W_i)`'s
  codes and scales side by side, so `.dequantize(d) == concatenate([W_i.dequantize(d)], -1)` bit for bit. Stacked
  tensors (one leading layer axis) are converted a layer at a time. ValueError unless `concat_reason(ws)` is None."""
  ws = tuple(ws)
  reason = concat_reason(ws)
  if reason:
    raise ValueError(f"from_nf4_concat: {reason}")
  if ws[0].lead_shape:
    return jax.lax.map(from_nf4_concat, ws)
  parts = [from_nf4(w) for w in ws]
  cat = lambda name: jnp.concatenate([getattr(p, name) for p in parts], axis=-2)
  return NF4KMajor(codes=cat("codes"), scale_even=cat("scale_even"), scale_odd=cat("scale_odd"),
                   shape=(ws[0].shape[0], sum(w.shape[1] for w in ws)), dtype=ws[0].dtype)
