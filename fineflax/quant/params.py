"""Quantising a decoder's parameter pytree (see `fineflax.models.decoder`) and measuring its storage.

Only the targeted linear kernels `layers/{name}/kernel` [L, in, out] are replaced; embeddings, norms,
biases and `lm_head` stay dense.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np

from fineflax.models.decoder import LINEAR_NAMES
from fineflax.models.targets import resolve_targets
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


def quantize_params(params: dict, targets: Sequence[str] = LINEAR_NAMES, kind: str = "nf4", *,
                    double_quant: bool = True, blocksize: int = 64) -> dict:
  """A copy of `params` whose `layers/{t}/kernel` (t in `targets`) are quantised; nothing else changes.

  `targets` uses the grammar of `fineflax.models.targets` (short names, HF names, fnmatch patterns,
  "all-linear"), as LoRA targets do. Already-quantised kernels are left as they are. Unknown target
  names raise a ValueError that lists the linear names present.
  """
  layers = params["layers"]
  targets = resolve_targets(tuple(targets), [n for n in LINEAR_NAMES if n in layers])
  if kind not in QUANT_KINDS:
    raise ValueError(f"quantisation kind={kind!r}; choose one of {QUANT_KINDS}")
  new_layers = dict(layers)
  for t in targets:
    kernel = layers[t]["kernel"]
    if not is_quantized(kernel):
      kernel = quantize_tensor(kernel, kind, double_quant=double_quant, blocksize=blocksize)
    new_layers[t] = {**layers[t], "kernel": kernel}
  return {**params, "layers": new_layers}


def dequantize_params(params: dict, dtype=None) -> dict:
  """Every quantised leaf replaced by its dense array (of `dtype`, default the tensor's own dtype)."""
  return jax.tree_util.tree_map(lambda x: x.dequantize(dtype) if is_quantized(x) else x, params,
                                is_leaf=is_quantized)


def bits_per_parameter(tensor) -> float:
  """Stored bits (all array leaves, NF4 double-quant statistics included) / number of parameters."""
  leaves = jax.tree_util.tree_leaves(tensor)
  stored = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize * 8 for x in leaves)
  return stored / math.prod(full_shape(tensor))
