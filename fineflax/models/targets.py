"""Names of a decoder's linear layers as users write them: one grammar for LoRA and quantisation targets.

A target pattern is a fineflax linear name or fnmatch pattern ("q", "*"), a Hugging Face module name
("q_proj", or Phi-3's fused "qkv_proj" / "gate_up_proj"), or "all-linear" (every linear layer).
"""
from __future__ import annotations

import fnmatch
from typing import Sequence

from fineflax.models.decoder import LINEAR_NAMES
from fineflax.models.hf_import import HF_LINEARS

# HF module name (q_proj ...) -> fineflax linear name (q ...)
HF_TO_NAME = {path.split(".")[-1]: name for name, path in HF_LINEARS.items()}
# fused HF modules (Phi-3) -> the fineflax linears they are split into at import
HF_FUSED = {"qkv_proj": ("q", "k", "v"), "gate_up_proj": ("gate", "up")}


def resolve_targets(patterns: Sequence[str], available: Sequence[str] = LINEAR_NAMES) -> tuple[str, ...]:
  """The linear names (in `available` order) matched by `patterns`; each pattern must match one.

  A pattern is a fineflax name or fnmatch pattern ("q", "*"), an HF module name ("q_proj"; Phi-3's fused
  "qkv_proj" / "gate_up_proj" select the linears they are split into), or "all-linear". Unknown patterns
  raise a ValueError listing the available names.
  """
  chosen: set[str] = set()
  for p in patterns:
    if p == "all-linear":
      chosen.update(available)
      continue
    if p in HF_FUSED:
      chosen.update(n for n in HF_FUSED[p] if n in available)
      continue
    p = HF_TO_NAME.get(p, p)
    hits = [n for n in available if fnmatch.fnmatchcase(n, p)]
    if not hits:
      raise ValueError(f"target module {p!r} matches no linear layer; available: {list(available)} "
                       f"(or HF names {[k for k, v in HF_TO_NAME.items() if v in available]}, 'all-linear')")
    chosen.update(hits)
  return tuple(n for n in available if n in chosen)
