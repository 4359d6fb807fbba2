"""LUFFY off-policy guidance as a component any environment can switch on (objective "luffy").

Each group of K rows holds `n_off` copies of one demonstration of its question (the environment's own,
e.g. a solver's worked solution, a scripted search trace or, for `config.env = "dataset"`, the trace that
travels with the row, or a text from a traces file keyed by question) and K - n_off on-policy samples. A
question without a demonstration gets K on-policy rows.
"""
from __future__ import annotations

from fineflax.rl.traces import load_traces


class Guidance:
  """n_off demonstration rows per group; `traces_path` ("" = the environment's demonstrations)."""

  def __init__(self, n_off: int, traces_path: str = ""):
    self.n_off = int(n_off)
    self.traces = {t.question: t.response for t in load_traces(traces_path)} if traces_path else None

  def demonstrations(self, env, policy, items) -> list[tuple[dict, dict] | None]:
    """Per item: (one off-policy row, its reward example), or None when there is no trace for it."""
    if self.traces is None:
      return env.demonstrations(policy, items)
    texts = [self.traces.get(p.question) for p in items]
    have = [i for i, t in enumerate(texts) if t is not None]
    demos = env.demonstrations(policy, [items[i] for i in have], [texts[i] for i in have]) if have else []
    out = [None] * len(items)
    for i, d in zip(have, demos):
      out[i] = d
    return out
