"""LoRA hyper-parameters and the adapter scale.

y = x @ W + dropout(x) @ A @ B * scale,  scale = alpha / r  (rsLoRA, Kalajdzievski 2023: alpha / sqrt(r)).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from fineflax.models.decoder import LINEAR_NAMES


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
