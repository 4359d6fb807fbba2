"""NF4 (QLoRA 4-bit NormalFloat) block-wise quantisation, byte-compatible with bitsandbytes.

For one tensor flattened row-major to x [n], cut into blocks of `blocksize` (default 64):
  absmax_b = max_{i in b} |x_i|,  q_i = nearest NF4 code to x_i / absmax_b (ties to the lower; see
  `blockwise`),  two codes a byte, the first in the high nibble;  x_i ~ NF4[q_i] * absmax_b.
Double quantisation (bnb `compress_statistics=True`): offset = mean(absmax); absmax - offset is stored with
`blockwise.quantize_blockwise8` (blocks of 256, bnb dynamic code); absmax ~ code8[q] * absmax2 + offset.
Storage per parameter: 4 + 8/64 + 32/(64*256) ~ 4.127 bits (4.5 without double quantisation).

Sizes that are not a multiple of the block are zero-padded to whole blocks; `shape` keeps the true size
and `dequantize` slices the padding off. Leading (stacked-layer) axes of the array leaves are free: every
leaf carries them, `shape` describes one tensor, so `lax.scan` over layers slices an `NF4Tensor` cleanly.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fineflax.quant.blockwise import (dequantize_blockwise8, nearest_code, quantize_blockwise8, rounded,
                                      scale_blocks)

# bitsandbytes.functional.get_4bit_type("nf4"): quantiles of N(0, 1) scaled to [-1, 1], with an exact 0.
NF4_CODE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], dtype=np.float32)
VALID_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
ABSMAX_BLOCKSIZE = 256  # bnb's block for the nested (double) quantisation of absmax


@struct.dataclass
class NF4Tensor:
  """A block-wise NF4 tensor. Leaves carry any leading axes `...`; `shape` is one tensor's shape.

  codes          uint8 [..., nblocks * blocksize / 2]   two 4-bit codes a byte, first in the high nibble
  absmax         f32 [..., nblocks], or uint8 [..., nblocks] when `double_quant`
  absmax_scale   f32 [..., ceil(nblocks / 256)]   (double_quant only, else None)
  absmax_offset  f32 [...]             (double_quant only, else None)
  """
  codes: jax.Array
  absmax: jax.Array
  absmax_scale: jax.Array | None
  absmax_offset: jax.Array | None
  shape: tuple[int, ...] = struct.field(pytree_node=False)
  dtype: Any = struct.field(pytree_node=False)
  blocksize: int = struct.field(pytree_node=False, default=64)
  double_quant: bool = struct.field(pytree_node=False, default=True)

  @property
  def size(self) -> int:
    """Elements of one tensor (without leading axes)."""
    return math.prod(self.shape)

  @property
  def num_blocks(self) -> int:
    return -(-self.size // self.blocksize)

  @property
  def lead_shape(self) -> tuple[int, ...]:
    return tuple(self.codes.shape[:-1])

  def absmax_f32(self) -> jnp.ndarray:
    """Per-block scales f32 [..., nblocks] (decodes the nested 8-bit quantisation when present)."""
    if not self.double_quant:
      return self.absmax
    absmax = dequantize_blockwise8(self.absmax, self.absmax_scale, self.num_blocks, ABSMAX_BLOCKSIZE)
    return rounded(absmax) + self.absmax_offset[..., None]  # two roundings, as bnb

  def dequantize(self, dtype=None) -> jnp.ndarray:
    """Dense [..., *shape] array of `dtype` (default: the dtype it was quantised from).

    Pure jnp (nibble unpack, code-book gather, per-block scale) so XLA can fuse it into the consumer.
    """
    dtype = self.dtype if dtype is None else dtype
    lead = self.lead_shape
    # nibbles by broadcast + shift (high nibble first) and a reshape that only merges axes (no concatenate).
    # A select tree instead of the 16-entry gather was tried: XLA:CPU's plan of the 7B QLoRA step then
    # grew from 2.1 to 5.6 GB of temporaries (unfused full-size selects), so the gather stays.
    shifts = jnp.asarray([4, 0], jnp.uint8)
    q = ((self.codes[..., None] >> shifts) & jnp.uint8(0xF)).reshape(*lead, -1)
    values = jnp.asarray(NF4_CODE)[q.astype(jnp.int32)].reshape(*lead, self.num_blocks, self.blocksize)
    w = (values * self.absmax_f32()[..., None]).reshape(*lead, -1)
    if w.shape[-1] != self.size:
      w = w[..., :self.size]
    return w.reshape(*lead, *self.shape).astype(dtype)


def _check_blocksize(blocksize: int) -> None:
  if blocksize not in VALID_BLOCKSIZES:
    raise ValueError(f"NF4 blocksize={blocksize!r}; bitsandbytes supports {VALID_BLOCKSIZES}")


def _quantize_flat(x: jnp.ndarray, blocksize: int, double_quant: bool):
  """One flat tensor x [n] -> (codes, absmax, absmax_scale, absmax_offset) as bitsandbytes computes them."""
  s, absmax = scale_blocks(x, blocksize)
  q = nearest_code(s, NF4_CODE).reshape(-1, 2)
  codes = (q[:, 0] << 4) | q[:, 1]
  if not double_quant:
    return codes, absmax, None, None
  offset = jnp.mean(absmax)
  qabs, absmax2 = quantize_blockwise8(absmax - offset, ABSMAX_BLOCKSIZE)
  return codes, qabs, absmax2, offset


@functools.partial(jax.jit, static_argnums=(1, 2))
def _quantize_rows(rows: jnp.ndarray, blocksize: int, double_quant: bool):
  """rows [m, n]: each row an independent tensor; `lax.map` keeps one row's f32 temporaries live."""
  return jax.lax.map(lambda x: _quantize_flat(x, blocksize, double_quant), rows)


def quantize_nf4(w: jnp.ndarray, blocksize: int = 64, double_quant: bool = True,
                 lead_dims: int = 0) -> NF4Tensor:
  """NF4-quantises `w`; its first `lead_dims` axes are stacked tensors quantised independently.

  A stacked kernel [L, in, out] takes lead_dims=1 and gives `shape == (in, out)`. The loop over leading
  entries is a `lax.map`, so only one tensor's f32 intermediates are live at a time.
  """
  _check_blocksize(blocksize)
  if lead_dims < 0 or lead_dims > w.ndim:
    raise ValueError(f"lead_dims={lead_dims} for an array of shape {w.shape}")
  shape = tuple(w.shape[lead_dims:])
  if math.prod(shape) == 0:
    raise ValueError(f"cannot NF4-quantise an empty tensor of shape {w.shape}")
  lead = tuple(w.shape[:lead_dims])
  leaves = _quantize_rows(w.reshape(-1, math.prod(shape)), blocksize, double_quant)
  leaves = [None if a is None else a.reshape(*lead, *a.shape[1:]) for a in leaves]
  codes, absmax, absmax2, offset = leaves
  return NF4Tensor(codes=codes, absmax=absmax, absmax_scale=absmax2, absmax_offset=offset, shape=shape,
                   dtype=jnp.dtype(w.dtype), blocksize=blocksize, double_quant=double_quant)
