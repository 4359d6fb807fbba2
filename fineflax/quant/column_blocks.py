"""An NF4 kernel [in, out] stored as n column blocks, so each block is one contiguous range of its leaves
and the kernel can be split over n devices by its output columns (tensor parallelism's q / k / v / gate /
up; `fineflax.engine.tensor_parallel`).

An `NF4Tensor` flattens its tensor row-major, so the columns of one device are strided through its codes.
`column_blocks(w, n)` re-orders the leaves to the tensor [n, in, out / n] (block s = columns
[s out/n, (s + 1) out/n)): with out / n a multiple of the NF4 block size, every NF4 block lies inside one
row of one column block, so this is a permutation of whole blocks: the same codes and the same per-block
scales, the same dequantised values bit for bit. Double-quantised scales are decoded to f32 first (their
nested 8-bit groups would straddle blocks): 4.5 instead of 4.127 bits a parameter.

    ColumnBlocks.dequantize(dtype) = moveaxis(blocks.dequantize(dtype), -3, -2).reshape(..., in, out)
"""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import struct

from fineflax.quant.nf4 import NF4Tensor


@struct.dataclass
class ColumnBlocks:
  """A quantised [..., in, out] kernel held as `blocks`, an NF4Tensor of shape (n, in, out / n)."""
  blocks: Any

  @property
  def shape(self) -> tuple[int, int]:
    n, k, o = self.blocks.shape
    return (k, n * o)

  @property
  def lead_shape(self) -> tuple[int, ...]:
    return self.blocks.lead_shape

  @property
  def dtype(self):
    return self.blocks.dtype

  def dequantize(self, dtype=None) -> jnp.ndarray:
    w = self.blocks.dequantize(dtype)  # [..., n, in, out / n]
    return jnp.moveaxis(w, -3, -2).reshape(*w.shape[:-3], w.shape[-2], -1)


def column_blocks(w: NF4Tensor, n: int) -> ColumnBlocks:
  """`w` (an NF4 [.., in, out] kernel, stacked leading axes allowed) as n column blocks, exactly (module
  docstring). ValueError unless out is a multiple of n x blocksize."""
  if not isinstance(w, NF4Tensor) or len(w.shape) != 2:
    raise ValueError(f"column_blocks: expected an NF4 kernel [in, out], got {type(w).__name__}")
  k, out = w.shape
  if out % (n * w.blocksize):
    raise ValueError(f"column_blocks: {out} output columns are not a multiple of {n} devices x NF4 block "
                     f"{w.blocksize}: the blocks would straddle devices")
  lead, o = w.lead_shape, out // n
  permute = lambda x, per_row: jnp.moveaxis(x.reshape(*lead, k, n, per_row), -2, -3).reshape(*lead, -1)
  codes = permute(w.codes, o // 2)
  absmax = permute(w.absmax_f32(), o // w.blocksize)
  return ColumnBlocks(NF4Tensor(codes=codes, absmax=absmax, absmax_scale=None, absmax_offset=None, shape=(n, k, o),
                                dtype=w.dtype, blocksize=w.blocksize, double_quant=False))
