"""Int8 weight quantisation with one absmax scale per output column (LLM.int8()-style vector-wise, no outliers).

For a kernel W [..., in, out] (y = x @ W):
  scale_j = max_i |W_ij| / 127,   q_ij = round(W_ij / scale_j) in [-127, 127],   W_ij ~ q_ij * scale_j,
so |W_ij - q_ij * scale_j| <= scale_j / 2. Columns that are all zero get scale 0 and dequantise to 0.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Int8Tensor:
  """q int8 [..., in, out]; scale f32 [..., out]; `shape` is one tensor's (in, out)."""
  q: jax.Array
  scale: jax.Array
  shape: tuple[int, ...] = struct.field(pytree_node=False)
  dtype: Any = struct.field(pytree_node=False)

  @property
  def lead_shape(self) -> tuple[int, ...]:
    return tuple(self.q.shape[:-len(self.shape)])

  def dequantize(self, dtype=None) -> jnp.ndarray:
    """Dense [..., in, out] = q * scale (f32 product, then cast to `dtype`)."""
    dtype = self.dtype if dtype is None else dtype
    return (self.q.astype(jnp.float32) * self.scale[..., None, :]).astype(dtype)


def quantize_int8(w: jnp.ndarray, lead_dims: int | None = None) -> Int8Tensor:
  """Int8-quantises a kernel [..., in, out] with per-output-column absmax scales.

  `lead_dims` defaults to w.ndim - 2 (everything before (in, out) is a stacked axis).
  """
  if w.ndim < 2:
    raise ValueError(f"int8 quantisation needs a kernel [..., in, out]; got shape {w.shape}")
  lead_dims = w.ndim - 2 if lead_dims is None else lead_dims
  if lead_dims != w.ndim - 2:
    raise ValueError(f"int8 quantisation is per output column of [..., in, out]: lead_dims={lead_dims} "
                     f"for shape {w.shape} must be {w.ndim - 2}")
  wf = w.astype(jnp.float32)
  scale = jnp.max(jnp.abs(wf), axis=-2) / 127.0
  q = jnp.round(wf / jnp.where(scale == 0, 1.0, scale)[..., None, :])
  q = jnp.clip(q, -127, 127).astype(jnp.int8)
  return Int8Tensor(q=q, scale=scale, shape=tuple(w.shape[-2:]), dtype=jnp.dtype(w.dtype))
