"""Layer i of a stacked NF4 kernel, as a view: the stacked leaves and a static index, not a sliced copy.

The unrolled decoder (`fineflax.models.unrolled`) runs every layer's linears from the stacked [L, ...]
quantised kernels. Slicing layer i out (`a[i]` on each leaf) fuses into XLA's dequantisation, but in front
of a custom call (the fused Pallas kernel, `fineflax.quant.nf4_gemv`) it is a copy of the codes: three
times the bytes the product needs. `NF4Layer(stacked, i)` keeps the leaves whole; the kernel reads layer i
in place (its block index maps offset by i), and `dequantize` slices as before (XLA fuses it).

  NF4Layer(w, i).dequantize(dtype) == jax.tree.map(lambda a: a[i], w).dequantize(dtype)
"""
from __future__ import annotations

import jax
from flax import struct

from fineflax.quant.nf4 import NF4Tensor
from fineflax.quant.nf4_kmajor import NF4KMajor


@struct.dataclass
class NF4Layer:
  """Layer `layer` of `stacked`, an NF4Tensor (or its K-major layout, `NF4KMajor`) with one leading (layer) axis."""
  stacked: NF4Tensor | NF4KMajor
  layer: int = struct.field(pytree_node=False)

  def __post_init__(self):
    if isinstance(self.stacked, (NF4Tensor, NF4KMajor)) and not hasattr(self.stacked.codes, "shape"):
      return  # rebuilt by a tree transform around placeholder leaves (custom_vjp's cotangent structure)
    lead = getattr(self.stacked, "lead_shape", None)
    if not isinstance(self.stacked, (NF4Tensor, NF4KMajor)) or lead is None or len(lead) != 1:
      raise ValueError(f"NF4Layer: an NF4Tensor or NF4KMajor with one leading axis needed, got "
                       f"{type(self.stacked).__name__} with leading axes {lead}")
    if not 0 <= self.layer < lead[0]:
      raise ValueError(f"NF4Layer: layer={self.layer} outside [0, {lead[0]})")

  @property
  def shape(self) -> tuple[int, ...]:
    return self.stacked.shape

  @property
  def dtype(self):
    return self.stacked.dtype

  @property
  def double_quant(self) -> bool:
    return getattr(self.stacked, "double_quant", False)

  def sliced(self) -> NF4Tensor | NF4KMajor:
    return jax.tree.map(lambda a: a[self.layer], self.stacked)

  def dequantize(self, dtype=None):
    return self.sliced().dequantize(dtype)
