"""Quantised tensors as pytree leaves: quantising one kernel or a stacked one layer at a time, dequantising
every quantised leaf of a pytree, and measuring storage. Which kernels of a decoder are quantised is
`fineflax.models.quantize.quantize_params`'s business (this package knows no model).
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fineflax.quant.int8 import Int8Tensor, quantize_int8
from fineflax.quant.nf4 import NF4Tensor, quantize_nf4

QUANT_KINDS = ("nf4", "int8")
QuantizedTensor = NF4Tensor | Int8Tensor


def is_quantized(x) -> bool:
  return isinstance(x, (NF4Tensor, Int8Tensor))


def full_shape(w) -> tuple[int, ...]:
  """Shape of the dense array `w` stands for, leading (stacked) axes included."""
  if is_quantized(w):
    return tuple(w.lead_shape) + tuple(w.shape)
  return tuple(w.shape)


def quantize_tensor(w, kind: str = "nf4", *, double_quant: bool = True, blocksize: int = 64,
                    lead_dims: int = 1) -> QuantizedTensor:
  """One kernel [L, in, out] (lead_dims=1) -> NF4Tensor | Int8Tensor."""
  if kind == "nf4":
    return quantize_nf4(w, blocksize=blocksize, double_quant=double_quant, lead_dims=lead_dims)
  if kind == "int8":
    return quantize_int8(w, lead_dims=lead_dims)
  raise ValueError(f"quantisation kind={kind!r}; choose one of {QUANT_KINDS}")


@functools.partial(jax.jit, donate_argnums=0)
def _write_layer(stacked, piece, i):
  """stacked[i] = piece, leaf by leaf, in place (the stacked buffers are donated)."""
  return jax.tree_util.tree_map(lambda s, p: jax.lax.dynamic_update_index_in_dim(s, p, i, 0), stacked, piece)


def quantize_layers(get_layer: Callable[[int], object], num_layers: int, kind: str = "nf4", *,
                    double_quant: bool = True, blocksize: int = 64) -> QuantizedTensor:
  """The quantised stacked kernel [L, in, out] whose layer i is `get_layer(i)` [in, out] (NumPy or jax).

  Equals `quantize_tensor(stack([get_layer(i) for i < L]), kind, lead_dims=1)` (each layer is quantised on
  its own either way). The stacked buffers are allocated once, from layer 0's shapes, and every layer is
  written into them in place (donated), so the device holds the result, one dense layer and that layer's
  quantisation temporaries: never the dense [L, in, out] kernel, and no second copy of the result.
  """
  one = lambda i: quantize_tensor(jnp.asarray(get_layer(i)), kind, double_quant=double_quant,
                                  blocksize=blocksize, lead_dims=0)
  first = one(0)
  stacked = jax.tree_util.tree_map(lambda p: jnp.zeros((num_layers, *p.shape), p.dtype), first)
  for i in range(num_layers):
    stacked = _write_layer(stacked, first if i == 0 else one(i), jnp.int32(i))
  return stacked


def dequantize_params(params: dict, dtype=None) -> dict:
  """Every quantised leaf replaced by its dense array (of `dtype`, default the tensor's own dtype)."""
  return jax.tree_util.tree_map(lambda x: x.dequantize(dtype) if is_quantized(x) else x, params,
                                is_leaf=is_quantized)


def bits_per_parameter(tensor) -> float:
  """Stored bits (all array leaves, NF4 double-quant statistics included) / number of parameters."""
  leaves = jax.tree_util.tree_leaves(tensor)
  stored = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize * 8 for x in leaves)
  return stored / math.prod(full_shape(tensor))
