"""A search engine slowed to a dense engine's CPU cost, for server tests and the hostile-client probes."""
from __future__ import annotations

import time


class SlowEngine:
  """An engine that sleeps `per_query` s per query before searching (a dense engine's cost on a CPU)."""

  def __init__(self, engine, per_query: float):
    self.engine, self.per_query = engine, per_query

  def __len__(self):
    return len(self.engine)

  def search_batch(self, queries, k):
    time.sleep(self.per_query * len(queries))
    return self.engine.search_batch(queries, k)
