"""Rank fusion of several retrievers' result lists (each a best-first list of (id, score)).

Reciprocal rank fusion (Cormack et al. 2009), weighted:
  rrf(d) = sum_i w_i / (k + rank_i(d)),  rank from 1, counted only if rank_i(d) <= window.
Convex combination of min-max normalised scores:
  cc(d) = sum_i w_i (s_i(d) - min_i) / (max_i - min_i)  over list i's top `window`; absent -> 0,
  a list whose scores are all equal normalises to 1.
Both return a best-first list of (id, fused score); ties keep first-seen order.
"""
from __future__ import annotations

from typing import Sequence

Ranking = Sequence[tuple[str, float]]


def _weights(rankings: Sequence[Ranking], weights: Sequence[float] | None) -> list[float]:
  if weights is None:
    return [1.0] * len(rankings)
  if len(weights) != len(rankings):
    raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
  return [float(w) for w in weights]


def _sorted(scores: dict[str, float]) -> list[tuple[str, float]]:
  return sorted(scores.items(), key=lambda kv: -kv[1])


def rrf(rankings: Sequence[Ranking | Sequence[str]], weights: Sequence[float] | None = None,
        k: float = 60.0, window: int = 100) -> list[tuple[str, float]]:
  """Weighted reciprocal rank fusion; each ranking is ids or (id, score) pairs, best first."""
  if k < 0 or window < 1:
    raise ValueError(f"k={k}, window={window}: need k >= 0 and window >= 1")
  fused: dict[str, float] = {}
  for w, ranking in zip(_weights(rankings, weights), rankings):
    for rank, item in enumerate(list(ranking)[:window], start=1):
      doc = item if isinstance(item, str) else item[0]
      fused[doc] = fused.get(doc, 0.0) + w / (k + rank)
  return _sorted(fused)


def convex_combination(rankings: Sequence[Ranking], weights: Sequence[float] | None = None,
                       window: int = 100) -> list[tuple[str, float]]:
  """Weighted sum of per-list min-max normalised scores."""
  if window < 1:
    raise ValueError(f"window={window}: need window >= 1")
  fused: dict[str, float] = {}
  for w, ranking in zip(_weights(rankings, weights), rankings):
    top = list(ranking)[:window]
    if not top:
      continue
    lo, hi = min(s for _, s in top), max(s for _, s in top)
    for doc, s in top:
      norm = (s - lo) / (hi - lo) if hi > lo else 1.0
      fused[doc] = fused.get(doc, 0.0) + w * norm
  return _sorted(fused)
