"""LoRA hyper-parameters and the adapter scale.

y = x @ W + dropout(x) @ A @ B * scale,  scale = alpha / r  (rsLoRA, Kalajdzievski 2023: alpha / sqrt(r)).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Any, Mapping, Sequence

from fineflax.models.decoder import LINEAR_NAMES
from fineflax.models.hf_import import HF_LINEARS

# HF module name (q_proj ...) -> fineflax linear name (q ...)
HF_TO_NAME = {path.split(".")[-1]: name for name, path in HF_LINEARS.items()}
# fused HF modules (Phi-3) -> the fineflax linears they are split into at import
HF_FUSED = {"qkv_proj": ("q", "k", "v"), "gate_up_proj": ("gate", "up")}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """r: rank; alpha: scale numerator; dropout: on the adapter input (training only);
  target_modules: name patterns (fnmatch) over the linears q, k, v, o, gate, up, down (HF names such as
  "q_proj" and "all-linear" also accepted); use_rslora: scale alpha / sqrt(r) instead of alpha / r."""
  r: int = 16
  alpha: float = 32.0
  dropout: float = 0.0
  target_modules: tuple[str, ...] = LINEAR_NAMES
  use_rslora: bool = False

  def __post_init__(self):
    if isinstance(self.target_modules, str):
      object.__setattr__(self, "target_modules", (self.target_modules,))
    else:
      object.__setattr__(self, "target_modules", tuple(self.target_modules))
    if not isinstance(self.r, int) or self.r <= 0:
      raise ValueError(f"LoraConfig.r={self.r!r}: the rank must be a positive integer")
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"LoraConfig.dropout={self.dropout!r}: must be in [0, 1)")

  @classmethod
  def from_mapping(cls, m: Mapping[str, Any]) -> "LoraConfig":
    """From a dict or ml_collections.ConfigDict with fields r, alpha, dropout, targets|target_modules,
    rslora|use_rslora."""
    m = dict(m)
    targets = m.get("target_modules", m.get("targets", LINEAR_NAMES))
    return cls(r=int(m.get("r", 16)), alpha=float(m.get("alpha", 32.0)),
               dropout=float(m.get("dropout", 0.0)), target_modules=tuple(targets),
               use_rslora=bool(m.get("use_rslora", m.get("rslora", False))))


def lora_scale(cfg: LoraConfig) -> float:
  """alpha / r, or alpha / sqrt(r) with rsLoRA."""
  return cfg.alpha / (math.sqrt(cfg.r) if cfg.use_rslora else cfg.r)


def resolve_targets(patterns: Sequence[str], available: Sequence[str] = LINEAR_NAMES) -> tuple[str, ...]:
  """The linear names (in `available` order) matched by `patterns`; each pattern must match one.

  A pattern is a fineflax name or fnmatch pattern ("q", "*"), an HF module name ("q_proj"; Phi-3's fused
  "qkv_proj" / "gate_up_proj" select the linears they are split into), or "all-linear". Unknown patterns raise a ValueError listing the available names.
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
      raise ValueError(f"LoRA target module {p!r} matches no linear layer; available: {list(available)} "
                       f"(or HF names {[k for k, v in HF_TO_NAME.items() if v in available]}, 'all-linear')")
    chosen.update(hits)
  return tuple(n for n in available if n in chosen)
