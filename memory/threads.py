"""FAISS OpenMP thread count per call: one thread for a few queries, FAISS's default for batches.

On a small shared machine FAISS's default OpenMP team makes one-query search several times slower than a
single thread (the team's start-up and barrier cost more than the scan), so memory/ searches fewer than
`BATCH` queries on one thread. `faiss.omp_set_num_threads` is process-wide: the previous count is restored
after the call.
"""
from __future__ import annotations

import contextlib

BATCH = 8  # fewer queries than this run on one thread


@contextlib.contextmanager
def faiss_threads(n_queries: int, threads: int | None = None):
  """Runs the block with `threads` OpenMP threads (default: 1 if n_queries < BATCH, else unchanged)."""
  import faiss
  if threads is None:
    threads = 1 if n_queries < BATCH else 0
  if threads <= 0:
    yield
    return
  before = faiss.omp_get_max_threads()
  faiss.omp_set_num_threads(threads)
  try:
    yield
  finally:
    faiss.omp_set_num_threads(before)
