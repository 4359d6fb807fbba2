"""Quantising a decoder's parameter pytree (see `fineflax.models.decoder`): only the targeted linear
kernels `layers/{name}/kernel` [L, in, out] are replaced (by `fineflax.quant` tensors); embeddings, norms,
biases and `lm_head` stay dense.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fineflax.models.decoder import LINEAR_NAMES
from fineflax.models.targets import resolve_targets
from fineflax.quant.params import QUANT_KINDS, is_quantized, quantize_layers, quantize_tensor


def quantize_params(params: dict, targets: Sequence[str] = LINEAR_NAMES, kind: str = "nf4", *,
                    double_quant: bool = True, blocksize: int = 64) -> dict:
  """A copy of `params` whose `layers/{t}/kernel` (t in `targets`) are quantised; nothing else changes.

  `targets` uses the grammar of `fineflax.models.targets` (short names, HF names, fnmatch patterns,
  "all-linear"), as LoRA targets do. Already-quantised kernels are left as they are. Unknown target
  names raise a ValueError that lists the linear names present. A NumPy kernel (host memory, as
  `fineflax.models.load(..., on_device=False)` gives) is quantised one layer at a time
  (`quantize_layers`): its dense [L, in, out] array never reaches the device.
  """
  layers = params["layers"]
  targets = resolve_targets(tuple(targets), [n for n in LINEAR_NAMES if n in layers])
  if kind not in QUANT_KINDS:
    raise ValueError(f"quantisation kind={kind!r}; choose one of {QUANT_KINDS}")
  new_layers = dict(layers)
  for t in targets:
    kernel = layers[t]["kernel"]
    if isinstance(kernel, np.ndarray):
      kernel = quantize_layers(kernel.__getitem__, kernel.shape[0], kind, double_quant=double_quant,
                               blocksize=blocksize)
    elif not is_quantized(kernel):
      kernel = quantize_tensor(kernel, kind, double_quant=double_quant, blocksize=blocksize)
    new_layers[t] = {**layers[t], "kernel": kernel}
  return {**params, "layers": new_layers}
