"""Win/tie/loss outcomes and their bootstrap confidence intervals.

An outcome per example is +1 (A wins), 0 (tie) or -1 (B wins). The bootstrap draws `num_resamples` sets of n
examples with replacement (NumPy generator seeded by `seed`) and reports the 2.5th/97.5th percentiles of each
statistic (percentile interval, Efron & Tibshirani 1993, ch. 13):
  win = mean(o == 1), tie = mean(o == 0), loss = mean(o == -1), net = win - loss,
  score = win + tie / 2 (the "win rate" with ties counted half, as in Chatbot Arena / AlpacaEval).
`mean_ci` does the same for the mean of any per-example values (e.g. paired metric differences).
`t_interval` is the parametric one (Student t) for few values, e.g. a metric over a handful of seeds, or
a mean known only by its count and sums (the serving feedback log). For sampled answers: `avg_at_n` (mean correctness of n samples a question) and `pass_at_k` (unbiased).
"""
from __future__ import annotations

import math
from typing import Sequence

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


def t_interval(values: Sequence[float] | None = None, *, n: int | None = None, total: float | None = None,
               total_sq: float | None = None, level: float = 0.95) -> tuple[float, float, float]:
  """(mean, low, high) of the Student t interval of the mean: mean -+ t_{(1+level)/2, n-1} · s / sqrt(n), s the
  sample standard deviation (ddof = 1). Takes the values, or their count n, sum and sum of squares
  (s^2 = (total_sq - n · mean^2) / (n - 1), floored at 0). low and high are nan for n = 1; n = 0 raises."""
  from scipy import stats
  if values is not None:
    x = np.asarray(values, np.float64)
    n, mean = len(x), float(x.mean()) if len(x) else math.nan
    var = float(x.var(ddof=1)) if n > 1 else math.nan
  else:
    mean = total / n if n else math.nan
    var = max(total_sq - n * mean * mean, 0.0) / (n - 1) if n > 1 else math.nan
  if not n:
    raise ValueError("the t interval of a mean needs at least one value")
  if n < 2:
    return mean, math.nan, math.nan
  half = float(stats.t.ppf((1 + level) / 2, n - 1)) * math.sqrt(var / n)
  return mean, mean - half, mean + half


def pass_at_k(correct, k: int) -> np.ndarray:
  """Per row (question) of correct [rows, n] (n samples each): the unbiased pass@k estimate of Chen et al.
  2021 (Codex), 1 - C(n - c, k) / C(n, k) with c correct samples, in their stable product form
  1 - prod_{i = n - c + 1}^{n} (1 - k / i); 1 when n - c < k."""
  c = np.asarray(correct, bool)
  if c.ndim != 2 or not 1 <= k <= c.shape[1]:
    raise ValueError(f"need correct [rows, n] and 1 <= k <= n; got shape {c.shape}, k={k}")
  n, hits = c.shape[1], c.sum(1)
  return np.array([1.0 if n - h < k else 1.0 - float(np.prod(1.0 - k / np.arange(n - h + 1, n + 1)))
                   for h in hits])


def avg_at_n(correct) -> float:
  """Mean correctness over all rows and their n samples (avg@n; greedy accuracy for n = 1)."""
  c = np.asarray(correct, np.float64)
  if c.ndim != 2 or not c.size:
    raise ValueError(f"need correct [rows, n], got shape {c.shape}")
  return float(c.mean())
