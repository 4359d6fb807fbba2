"""The order in which an RL run visits its training questions, as a function of the position alone.

  order = EpochOrder(n, seed, reshuffle=True)
  order[k] = perm_e[k % n] with e = k // n (epoch), perm_e = default_rng(seed).permutation(n) for e = 0 and,
             with reshuffle, default_rng([seed, e]).permutation(n) for e >= 1 (else perm_0 every epoch)

Position k of step s is (s - 1) * prompts_per_step + i, so a resumed run picks up the same questions
without saving anything. `StreamOrder` is the identity, for sets that shuffle themselves as they stream.
`CycleOrder` reads a fixed sequence cyclically; `AliveOrder` drops some questions from another order.
"""
from __future__ import annotations

import numpy as np


class EpochOrder:
  """Question index at every position k >= 0 (module docstring)."""

  def __init__(self, n: int, seed: int, reshuffle: bool = False):
    if n < 1:
      raise ValueError(f"no training questions (n={n})")
    self.n, self.seed, self.reshuffle = int(n), int(seed), bool(reshuffle)
    self._epoch, self._perm = 0, np.random.default_rng(self.seed).permutation(self.n)
    self._first = self._perm

  def permutation(self, epoch: int) -> np.ndarray:
    if epoch == 0 or not self.reshuffle:
      return self._first
    if epoch != self._epoch:
      self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n)
    return self._perm

  def __getitem__(self, k: int) -> int:
    epoch, i = divmod(int(k), self.n)
    if epoch < 0:
      raise IndexError(f"position {k}: positions start at 0")
    return int(self.permutation(epoch)[i])

  def __len__(self) -> int:
    return self.n


class StreamOrder:
  """order[k] = k: the training set itself maps position k to epoch k // n, row k % n."""

  def __init__(self, n: int):
    self.n = int(n)

  def __getitem__(self, k: int) -> int:
    return int(k)

  def __len__(self) -> int:
    return self.n


class CycleOrder:
  """order[k] = seq[k % n]: a fixed sequence (e.g. a NumPy permutation) read cyclically."""

  def __init__(self, seq):
    self.seq = [int(q) for q in seq]
    if not self.seq:
      raise ValueError("no training questions (an empty order)")

  def __getitem__(self, k: int) -> int:
    return self.seq[int(k) % len(self.seq)]

  def __len__(self) -> int:
    return len(self.seq)


def as_order(order):
  """`order` itself if it maps any position (has `n`: EpochOrder, StreamOrder, AliveOrder; or a CycleOrder,
  which iterating would never end), else a `CycleOrder` over the sequence."""
  return order if hasattr(order, "n") or isinstance(order, CycleOrder) else CycleOrder(order)


class AliveOrder:
  """`order` less the questions `keep(q)` rejects: epoch e is order's positions [e n, (e + 1) n) with the
  rejected questions removed (m kept of n); position k -> entry k % m of epoch k // m. If every question
  is rejected, `order` itself. Meant for orders whose epochs each hold every question once."""

  def __init__(self, order, keep):
    self.order, self.keep, self.n = order, keep, len(order)
    self._epoch, self._alive = None, None

  def alive(self, epoch: int) -> list:
    if epoch != self._epoch:
      qs = [int(self.order[epoch * self.n + i]) for i in range(self.n)]
      self._epoch, self._alive = epoch, [q for q in qs if self.keep(q)] or qs
    return self._alive

  def __getitem__(self, k: int) -> int:
    m = len(self.alive(0))
    epoch, i = divmod(int(k), m)
    return self.alive(epoch)[i]

  def __len__(self) -> int:
    return len(self.alive(0))
