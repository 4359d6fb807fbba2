"""Win/tie/loss outcomes and their bootstrap confidence intervals.

An outcome per example is +1 (A wins), 0 (tie) or -1 (B wins). The bootstrap draws `num_resamples` sets of n
examples with replacement (NumPy generator seeded by `seed`) and reports the 2.5th/97.5th percentiles of each
statistic (percentile interval, Efron & Tibshirani 1993, ch. 13):
  win = mean(o == 1), tie = mean(o == 0), loss = mean(o == -1), net = win - loss,
  score = win + tie / 2 (the "win rate" with ties counted half, as in Chatbot Arena / AlpacaEval).
`mean_ci` does the same for the mean of any per-example values (e.g. paired metric differences).
"""
from __future__ import annotations

import numpy as np

STATS = ("win", "tie", "loss", "net", "score")


def _stats(outcomes: np.ndarray) -> dict[str, np.ndarray]:
  """Statistics along the last axis of outcomes [..., n]."""
  win, tie, loss = ((outcomes == v).mean(-1) for v in (1, 0, -1))
  return {"win": win, "tie": tie, "loss": loss, "net": win - loss, "score": win + tie / 2}


def bootstrap_indices(n: int, num_resamples: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, n, size=(num_resamples, n))


def outcome_ci(outcomes, num_resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> dict:
  """{stat: {"value", "lo", "hi"}} for win/tie/loss/net/score of outcomes in {-1, 0, 1}."""
  o = np.asarray(outcomes, np.int64)
  if o.ndim != 1 or not len(o):
    raise ValueError(f"need a non-empty 1-D list of outcomes, got shape {o.shape}")
  if not np.isin(o, (-1, 0, 1)).all():
    raise ValueError(f"outcomes must be -1, 0 or 1, got {sorted(set(o.tolist()) - {-1, 0, 1})}")
  point = _stats(o)
  boot = _stats(o[bootstrap_indices(len(o), num_resamples, seed)])
  q = (100 * (1 - level) / 2, 100 * (1 + level) / 2)
  return {k: {"value": float(point[k]), "lo": float(np.percentile(boot[k], q[0])),
              "hi": float(np.percentile(boot[k], q[1]))} for k in STATS}


def mean_ci(values, num_resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> dict:
  """{"value", "lo", "hi"}: the mean of `values` and its bootstrap percentile interval."""
  v = np.asarray(values, np.float64)
  if v.ndim != 1 or not len(v):
    raise ValueError(f"need a non-empty 1-D list of values, got shape {v.shape}")
  boot = v[bootstrap_indices(len(v), num_resamples, seed)].mean(-1)
  q = (100 * (1 - level) / 2, 100 * (1 + level) / 2)
  return {"value": float(v.mean()), "lo": float(np.percentile(boot, q[0])), "hi": float(np.percentile(boot, q[1]))}
