"""An NF4 kernel split over a mesh axis (tensor parallelism), with how it is split, so that its products can
run the fused kernel (`fineflax.quant.nf4_gemv`) on each device's shard under shard_map instead of
dequantising the whole kernel through GSPMD.

`ShardedNF4(w, mesh, kind)` over the n devices of `mesh.shape[axis]` (`fineflax.engine.tensor_parallel`'s
Megatron layout):

  kind "column"  w a `ColumnBlocks` of n blocks; device s holds block s: W_s = W[:, s out/n : (s + 1) out/n]
                   y = concat_s (x @ W_s)                          (x replicated; y split over its columns)
  kind "row"     w an `NF4Tensor` [in, out] whose flat leaves are split contiguously: device s holds rows
                 s in/n : (s + 1) in/n (codes, block scales); nested scale groups / offsets replicated
                   y = sum_s x[:, s in/n : (s + 1) in/n] @ W_s     (x split over its columns; one psum)

or, either kind, w an `NF4KMajor` (`quant.nf4_kmajor`: codes [.., out, in / 2], scales [.., out / 64, in / 2]),
its leaves split over out (column: axis -2) or over in (row: axis -1): the same products, each device's shard
an NF4KMajor read by `nf4_kmajor_gemv`.

`layer`: leaves stacked over layers [L, ...] and read at layer `layer` in place (`NF4Layer`), not sliced.
A row kernel keeps its double-quantised scales when each device's blocks are whole nested groups of 256
(in out / (64 n) % 256 == 0, every real shape); otherwise, or when its scales are not split, `local` is
None and the product stays XLA's.

  ShardedNF4.dequantize(dtype) == (w at `layer`).dequantize(dtype)
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, PartitionSpec as P

from fineflax.quant.column_blocks import ColumnBlocks
from fineflax.quant.nf4 import ABSMAX_BLOCKSIZE, NF4Tensor
from fineflax.quant.nf4_kmajor import NF4KMajor
from fineflax.quant.nf4_layer import NF4Layer

KINDS = ("column", "row")


@struct.dataclass
class ShardedNF4:
  """An NF4 kernel [in, out] split over `axis` of `mesh` (module docstring)."""
  w: Any
  mesh: Mesh = struct.field(pytree_node=False)
  kind: str = struct.field(pytree_node=False)
  axis: str = struct.field(pytree_node=False, default="model")
  layer: int | None = struct.field(pytree_node=False, default=None)

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"ShardedNF4: kind={self.kind!r}; expected one of {KINDS}")
    want = (ColumnBlocks if self.kind == "column" else NF4Tensor, NF4KMajor)
    if not isinstance(self.w, want):
      raise ValueError(f"ShardedNF4(kind={self.kind!r}): w must be a {want[0].__name__} or an NF4KMajor, got "
                       f"{type(self.w).__name__}")

  @property
  def n(self) -> int:
    return int(self.mesh.shape[self.axis])

  @property
  def shape(self) -> tuple[int, int]:
    return tuple(self.w.shape)

  @property
  def dtype(self):
    return self.w.dtype

  @property
  def lead_shape(self) -> tuple[int, ...]:
    lead = self.w.lead_shape
    return lead if self.layer is None else lead[1:]

  def at_layer(self, layer: int) -> "ShardedNF4":
    """This kernel's layer `layer` of stacked leaves, as a view."""
    if self.layer is not None or len(self.w.lead_shape) != 1:
      raise ValueError(f"ShardedNF4.at_layer: leaves with one leading (layer) axis needed, got {self.w.lead_shape}"
                       + (f" at layer {self.layer}" if self.layer is not None else ""))
    return self.replace(layer=layer)

  def _one(self):
    return self.w if self.layer is None else jax.tree.map(lambda a: a[self.layer], self.w)

  def dequantize(self, dtype=None) -> jnp.ndarray:
    return self._one().dequantize(dtype)

  def _nf4(self) -> NF4Tensor | NF4KMajor:
    return self.w.blocks if isinstance(self.w, ColumnBlocks) else self.w

  def _kmajor_local(self) -> NF4KMajor | None:
    n, (k, out) = self.n, self.shape
    if (self.kind == "column" and out % (64 * n)) or (self.kind == "row" and k % (2 * n)):
      return None
    k, out = (k, out // n) if self.kind == "column" else (k // n, out)
    return NF4KMajor.abstract(k, out, self.w.dtype)

  def local(self) -> NF4Tensor | NF4KMajor | None:
    """One device's shard as an abstract unstacked NF4Tensor (or NF4KMajor; shapes only), or None where the
    kernel cannot read it in place (module docstring)."""
    if isinstance(self.w, NF4KMajor):
      return self._kmajor_local()
    w, n = self._nf4(), self.n
    k, out = self.shape
    if self.kind == "column":
      if w.shape[0] != n:  # blocks made for another device count
        return None
      shape, nested = (k, out // n), False
    else:
      blocks = w.num_blocks
      if k % n or blocks % n or w.codes.shape[-1] % n:
        return None
      nested = w.double_quant
      if nested and (blocks // n) % ABSMAX_BLOCKSIZE:
        return None
      shape = (k // n, out)
    size = shape[0] * shape[1]
    leaf = lambda length, dt: jax.ShapeDtypeStruct((length,), dt)
    groups = size // w.blocksize // ABSMAX_BLOCKSIZE
    return NF4Tensor(codes=leaf(size // 2, w.codes.dtype), absmax=leaf(size // w.blocksize, w.absmax.dtype),
                     absmax_scale=leaf(groups, jnp.float32) if nested else None,
                     absmax_offset=jax.ShapeDtypeStruct((), jnp.float32) if nested else None,
                     shape=shape, dtype=w.dtype, blocksize=w.blocksize, double_quant=nested)

  def _specs(self):
    """PartitionSpecs of the NF4 leaves: codes and block scales split along their last axis, the rest whole."""
    w = self._nf4()
    lead = [None] * len(w.lead_shape)
    if isinstance(w, NF4KMajor):  # column: over out (axis -2); row: over in (axis -1)
      split = P(*lead, self.axis, None) if self.kind == "column" else P(*lead, None, self.axis)
      return w.replace(codes=split, scale_even=split, scale_odd=split)
    split = P(*lead, self.axis)
    return w.replace(codes=split, absmax=split,
                     absmax_scale=None if w.absmax_scale is None else P(),
                     absmax_offset=None if w.absmax_offset is None else P())

  def product(self, x: jnp.ndarray, local_product: Callable) -> jnp.ndarray:
    """x [M, in] @ W -> [M, out], each device calling local_product(x_s, W_s) on its shard (an NF4Tensor or
    NF4KMajor, or an NF4Layer view of stacked leaves); requires `local()` not None."""
    shard = self.local()
    if shard is None:
      raise ValueError(f"ShardedNF4.product: this {self.kind} kernel of shape {self.shape} cannot be read in "
                       f"place on {self.n} devices; use dequantize")
    layer, axis = self.layer, self.axis

    def view(w):
      if self.kind == "row" and isinstance(w, NF4Tensor) and w.double_quant:
        # this device's nested groups: whole groups (local() checked)
        groups = shard.absmax_scale.shape[0]
        start = jax.lax.axis_index(axis) * groups
        w = w.replace(absmax_scale=jax.lax.dynamic_slice_in_dim(w.absmax_scale, start, groups, axis=-1))
      w = w.replace(shape=shard.shape)
      return w if layer is None else NF4Layer(w, layer)

    if self.kind == "column":
      body = lambda x, w: local_product(x, view(w))
      in_specs, out_specs = (P(), self._specs()), P(None, axis)
    else:
      body = lambda x, w: jax.lax.psum(local_product(x, view(w)), axis)
      in_specs, out_specs = (P(None, axis), self._specs()), P()
    return jax.shard_map(body, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(
        x, self._nf4())
