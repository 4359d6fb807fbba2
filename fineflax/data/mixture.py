"""Weighted, seeded, resumable mixing of sources.

Draw number s picks source j with probability w_j / sum(w): the choices come in blocks of `BLOCK` draws,
block b sampled by `np.random.default_rng([seed, b]).choice(k, BLOCK, p=w)`. Source j is read in epochs:
its c-th example (c = how many it has given so far) is row `perm_e[c % n_j]` of epoch e = c // n_j, with
`perm_e = np.random.default_rng([seed, 1 + j, e]).permutation(n_j)` (identity when shuffle=False).

Everything is a function of (seed, s, counts), so `state()` is the small dict
`{"step": s, "counts": [c_0, ..., c_{k-1}]}` and `restore(state)` continues with the same examples.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from fineflax.data.sources import Source, load_source

BLOCK = 1024


class Mixture:
  """Iterator of examples `{"messages": [...], "where": "FILE:line N", "source": name, "source_index": j,
  "row": i}` (row i of source j) from weighted sources, endless."""

  def __init__(self, sources: Sequence[tuple[Any, float]], seed: int = 0, shuffle: bool = True):
    if not sources:
      raise ValueError("Mixture needs at least one (source, weight) pair")
    self.sources: list[Source] = []
    weights = []
    for i, item in enumerate(sources):
      if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise ValueError(f"sources[{i}]: expected (source, weight), got {item!r}")
      src, w = item
      if not isinstance(w, (int, float)) or not np.isfinite(w) or w < 0:
        raise ValueError(f"sources[{i}]: weight must be a finite number >= 0, got {w!r}")
      self.sources.append(src if isinstance(src, Source) else load_source(src))
      weights.append(float(w))
    total = sum(weights)
    if total <= 0:
      raise ValueError(f"Mixture weights {weights} sum to 0")
    self.weights = np.asarray(weights) / total
    self.seed, self.shuffle = int(seed), shuffle
    self.step, self.counts = 0, [0] * len(self.sources)
    self._block: tuple[int, np.ndarray] | None = None
    self._perms: dict[int, tuple[int, np.ndarray]] = {}

  def _choice(self, step: int) -> int:
    b = step // BLOCK
    if self._block is None or self._block[0] != b:
      rng = np.random.default_rng([self.seed, b])
      self._block = (b, rng.choice(len(self.sources), BLOCK, p=self.weights))
    return int(self._block[1][step % BLOCK])

  def _row(self, j: int, count: int) -> int:
    n = len(self.sources[j])
    epoch = count // n
    if not self.shuffle:
      return count % n
    cached = self._perms.get(j)
    if cached is None or cached[0] != epoch:
      cached = (epoch, np.random.default_rng([self.seed, 1 + j, epoch]).permutation(n))
      self._perms[j] = cached
    return int(cached[1][count % n])

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    j = self._choice(self.step)
    row = self._row(j, self.counts[j])
    example = self.sources[j][row]
    self.step += 1
    self.counts[j] += 1
    example.update(source=self.sources[j].name, source_index=j, row=row)
    return example

  def state(self) -> dict:
    return {"step": self.step, "counts": list(self.counts)}

  def restore(self, state: dict) -> None:
    counts = [int(c) for c in state["counts"]]
    if len(counts) != len(self.sources):
      raise ValueError(f"mixture state has {len(counts)} source counts; this mixture has "
                       f"{len(self.sources)} sources")
    if sum(counts) != int(state["step"]):
      raise ValueError(f"mixture state is inconsistent: step {state['step']} != sum(counts) {sum(counts)}")
    self.step, self.counts = int(state["step"]), counts


def build_mixture(specs: Sequence[Mapping[str, Any]], seed: int = 0, shuffle: bool = True) -> Mixture:
  """A Mixture from config entries `{"source": spec, "weight": w, **load_source kwargs}`.

  e.g. [{"source": "sample:arithmetic_messages.jsonl", "weight": 3},
        {"source": "data/chat.jsonl", "weight": 1, "schema": "sharegpt", "on_bad_row": "skip"}]
  """
  pairs = []
  for i, entry in enumerate(specs):
    entry = dict(entry)
    if "source" not in entry:
      raise ValueError(f"data source entry {i} has no 'source': {entry}")
    src, weight = entry.pop("source"), entry.pop("weight", 1.0)
    pairs.append((src if isinstance(src, Source) else load_source(src, **entry), weight))
  return Mixture(pairs, seed=seed, shuffle=shuffle)
