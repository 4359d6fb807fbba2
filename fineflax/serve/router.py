"""Bandit routing of `model: "auto"` requests among variants, from the rewards of the feedback log.

Per variant v: n_v rewards, mean m_v; N = sum of n_v. A variant with n_v = 0 is chosen first (in order).

  UCB1:     argmax_v  m_v + sqrt(2 ln N / n_v)
  Thompson: argmax_v  theta_v,  theta_v ~ Beta(1 + s_v, 1 + f_v)   when all of v's rewards are 0 or 1
                                                                    (s_v successes, f_v failures)
                                theta_v ~ Normal(m_v, sd_v^2 / n_v) otherwise (sd_v the sample standard
                                deviation, 1 while n_v < 2)

State is the sufficient statistics (n, sum, sum of squares, all-binary), rebuilt from the log at start
(`Router(...).load(log.reward_sums())`), so routing survives restarts.

`ContextualRouter` keeps one such bandit per request category (its own statistics) and one over all
requests; a prior (n0, m0) for a variant (overall or in one category) counts as n0 pseudo-rewards of mean m0:
n += n0, sum += n0 m0, sum_sq += n0 m0^2 (all-binary unchanged, so Thompson draws Beta(1 + s + n0 m0,
1 + f + n0 (1 - m0))). All its bandits draw from one generator seeded by `seed`.
"""
from __future__ import annotations

import math
import threading
from typing import Sequence

import numpy as np

KINDS = ("ucb1", "thompson")


class Router:
  def __init__(self, variants: Sequence[str], kind: str = "ucb1", seed: int | None = None,
               rng: np.random.Generator | None = None):
    if kind not in KINDS:
      raise ValueError(f"router kind={kind!r}; choose one of {KINDS}")
    if not variants:
      raise ValueError("router: no variants to route among")
    self.variants, self.kind = list(variants), kind
    self.rng = rng if rng is not None else np.random.default_rng(seed)
    self.lock = threading.Lock()
    self.n = {v: 0 for v in self.variants}
    self.total = {v: 0.0 for v in self.variants}
    self.total_sq = {v: 0.0 for v in self.variants}
    self.binary = {v: True for v in self.variants}

  def load(self, sums: dict) -> "Router":
    """Adds `FeedbackLog.reward_sums()`-shaped statistics (variants not routed are ignored)."""
    with self.lock:
      for v, s in sums.items():
        if v in self.n:
          self.n[v] += int(s["n"])
          self.total[v] += float(s["sum"])
          self.total_sq[v] += float(s["sum_sq"])
          self.binary[v] = self.binary[v] and bool(s["binary"])
    return self

  def update(self, variant: str, reward: float, category: str | None = None) -> None:
    """Adds one reward (`category` is ignored: this bandit has no context; see `ContextualRouter`)."""
    if variant not in self.n:
      return
    with self.lock:
      self.n[variant] += 1
      self.total[variant] += reward
      self.total_sq[variant] += reward * reward
      self.binary[variant] = self.binary[variant] and reward in (0.0, 1.0)

  def choose(self, category: str | None = None) -> str:
    """The variant to route to (`category` is ignored, as in `update`)."""
    with self.lock:
      for v in self.variants:
        if self.n[v] == 0:
          return v
      if self.kind == "ucb1":
        big_n = sum(self.n.values())
        score = [self.total[v] / self.n[v] + math.sqrt(2.0 * math.log(big_n) / self.n[v])
                 for v in self.variants]
      else:
        score = [self._thompson(v) for v in self.variants]
      return self.variants[int(np.argmax(score))]

  def _thompson(self, v: str) -> float:
    n, mean = self.n[v], self.total[v] / self.n[v]
    if self.binary[v]:
      s = self.total[v]
      return float(self.rng.beta(1.0 + s, 1.0 + n - s))
    sd = math.sqrt(max(self.total_sq[v] - n * mean * mean, 0.0) / (n - 1)) if n > 1 else 1.0
    return float(self.rng.normal(mean, sd / math.sqrt(n)))

  def snapshot(self) -> dict:
    with self.lock:
      return {"kind": self.kind, "variants": {v: {"n": self.n[v], "mean": (self.total[v] / self.n[v]
                                                                         if self.n[v] else None)}
                                              for v in self.variants}}


def prior_sums(priors: dict) -> dict:
  """`load`-shaped statistics of priors {variant: {"n": n0, "mean": m0}} (module docstring)."""
  return {v: {"n": int(p["n"]), "sum": p["n"] * p["mean"], "sum_sq": p["n"] * p["mean"] ** 2, "binary": True}
          for v, p in priors.items()}


class ContextualRouter:
  """Bandits per category plus one overall (module docstring).

  choose(category): the category's bandit (created with its priors on first sight) when `contextual` and
  a category is given, else the overall one. update(variant, reward, category): the overall bandit and,
  with a category, that category's (statistics are kept per category even when not `contextual`, the
  non-contextual baseline). priors: {variant: {"n", "mean", "by_category": {category: {"n", "mean"}}}}.
  """

  def __init__(self, variants: Sequence[str], kind: str = "ucb1", seed: int | None = None, *,
               contextual: bool = True, priors: dict | None = None):
    self.variants, self.kind, self.contextual = list(variants), kind, contextual
    self.rng = np.random.default_rng(seed)
    self.priors = priors or {}
    self.lock = threading.Lock()
    self.overall = Router(self.variants, kind, rng=self.rng).load(
        prior_sums({v: p for v, p in self.priors.items() if "n" in p}))
    self.categories: dict[str, Router] = {}

  def _category(self, category: str) -> Router:
    with self.lock:
      if category not in self.categories:
        own = {v: p["by_category"][category] for v, p in self.priors.items()
               if category in p.get("by_category", {})}
        self.categories[category] = Router(self.variants, self.kind, rng=self.rng).load(prior_sums(own))
      return self.categories[category]

  def load(self, sums: dict) -> "ContextualRouter":
    """Adds `FeedbackLog.reward_sums(by_category=True)` statistics {(variant, category | None): sums}."""
    for (v, c), s in sums.items():
      self.overall.load({v: s})
      if c is not None:
        self._category(c).load({v: s})
    return self

  def choose(self, category: str | None = None) -> str:
    if self.contextual and category is not None:
      return self._category(category).choose()
    return self.overall.choose()

  def update(self, variant: str, reward: float, category: str | None = None) -> None:
    self.overall.update(variant, reward)
    if category is not None:
      self._category(category).update(variant, reward)

  def snapshot(self) -> dict:
    """The overall bandit's snapshot, "contextual", and {"categories": {category: its variants}}."""
    with self.lock:
      cats = dict(self.categories)
    return {**self.overall.snapshot(), "contextual": self.contextual,
            "categories": {c: r.snapshot()["variants"] for c, r in sorted(cats.items())}}


def simulate(router: Router, rates: dict[str, float], steps: int,
             seed: int = 0) -> tuple[list[str], np.ndarray]:
  """Routes `steps` requests; variant v's reward ~ Bernoulli(rates[v]), fed back at once.

  Returns (chosen variants, cumulative expected regret [steps]: sum_t max(rates) - rates[chosen_t]).
  """
  rng = np.random.default_rng(seed)
  best = max(rates.values())
  chosen, regret = [], np.zeros(steps)
  for t in range(steps):
    v = router.choose()
    router.update(v, float(rng.random() < rates[v]))
    chosen.append(v)
    regret[t] = (regret[t - 1] if t else 0.0) + best - rates[v]
  return chosen, regret


def simulate_contextual(router, rates: dict[str, dict[str, float]], categories: Sequence[str],
                        seed: int = 0) -> tuple[list[str], np.ndarray]:
  """Routes one request per entry of `categories`; in category c variant v's reward ~ Bernoulli(rates[c][v]),
  fed back at once with its category (`router`: a ContextualRouter, or any with choose(c) / update(v, r, c)).

  Returns (chosen variants, cumulative expected regret: sum_t max_v rates[c_t][v] - rates[c_t][chosen_t]).
  """
  rng = np.random.default_rng(seed)
  chosen, regret, total = [], np.zeros(len(categories)), 0.0
  for t, c in enumerate(categories):
    v = router.choose(c)
    router.update(v, float(rng.random() < rates[c][v]), c)
    chosen.append(v)
    total += max(rates[c].values()) - rates[c][v]
    regret[t] = total
  return chosen, regret
