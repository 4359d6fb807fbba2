"""tunix worker of benchmarks/rl.py (placeholder until the GRPOLearner wiring lands)."""
from __future__ import annotations


def run(spec: dict) -> dict:
  import tunix  # noqa: F401
  raise NotImplementedError("tunix worker not written yet")
