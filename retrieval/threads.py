"""FAISS OpenMP threads chosen per call: one thread for small query batches, all cores for big ones.

FAISS parallelises a search over queries (and BLAS over the distance matrix) with OpenMP. For a few
queries the fork/join and spinning of idle workers cost more than the work: on a 2-core machine a
single-query flat search over 5k-100k vectors ran several times slower with the default thread count
than with one thread (benchmarks/retrieval.py, "FAISS threads"). omp_set_num_threads acts on the calling
thread only, so a server's search threads and the caller's other threads do not disturb each other.

  threads_for(Q, n, d) = default_threads() if Q >= 2 and Q * n * d >= MIN_PARALLEL_WORK else 1
      (flat-search multiply-adds; without n and d: default_threads() if Q >= SMALL_BATCH else 1)
  with faiss_threads(k): ...                    # FAISS calls in this thread use k threads, restored after
  with faiss_threads(num_queries=Q, num_vectors=n, dim=d):   # k = threads_for(Q, n, d)
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

from retrieval.lazy import lazy_import

faiss = lazy_import("faiss", "faiss-cpu")

SMALL_BATCH = 128  # without index size: batches below this many queries search on one thread
MIN_PARALLEL_WORK = 1 << 27  # Q * n * d multiply-adds from which 2 threads paid off on 2 cores (the benchmark)


def default_threads() -> int:
  """OMP_NUM_THREADS if set, else the CPUs this process may run on (OpenMP's own default)."""
  env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
  if env.isdigit() and int(env) > 0:
    return int(env)
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_for(num_queries: int, num_vectors: int = 0, dim: int = 0) -> int:
  """The thread count for searching num_queries queries over num_vectors vectors of dim dimensions."""
  if num_vectors and dim:
    parallel = num_queries >= 2 and num_queries * num_vectors * dim >= MIN_PARALLEL_WORK
  else:
    parallel = num_queries >= SMALL_BATCH
  return default_threads() if parallel else 1


@contextlib.contextmanager
def faiss_threads(n: int | None = None, *, num_queries: int | None = None, num_vectors: int = 0,
                  dim: int = 0) -> Iterator[int]:
  """Runs the block with FAISS on n OpenMP threads (or threads_for(num_queries, num_vectors, dim)) in this
  thread; restores the previous count on exit. Yields the count used."""
  if n is None:
    if num_queries is None:
      raise TypeError("faiss_threads needs n or num_queries")
    n = threads_for(num_queries, num_vectors, dim)
  if n < 1:
    raise ValueError(f"n={n}: FAISS needs at least one thread")
  previous = faiss.omp_get_max_threads()
  faiss.omp_set_num_threads(n)
  try:
    yield n
  finally:
    faiss.omp_set_num_threads(previous)
