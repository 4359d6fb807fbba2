"""Memory layer speed on CPU: chunking and ingestion of the Python standard library, and query latency
of a 100k-chunk VectorStore collection (synthetic 384-d unit vectors) with and without metadata filters.

  python benchmarks/memory.py [--max-files 40] [--n 100000] [--queries 200]

Ingestion embeds with all-MiniLM-L6-v2 (retrieval.embedder, JAX backend); it is capped at --max-files
files because embedding the whole library takes too long on 2 cores. Chunking alone runs on all files.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import platform
import shutil
import sys
import sysconfig
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks._results import markdown_table, write_section  # noqa: E402
from memory.chunking import chunk_file  # noqa: E402
from memory.ingest import ingest, walk  # noqa: E402
from memory.store import VectorStore, default_embedding_function  # noqa: E402


def stdlib_folder() -> pathlib.Path:
  """A copy-free view of the stdlib: its top-level *.py files and packages without tests."""
  return pathlib.Path(sysconfig.get_paths()["stdlib"])


def bench_chunking(files: list[pathlib.Path]) -> list:
  t = time.perf_counter()
  n_chunks = sum(len(chunk_file(f)) for f in files)
  dt = time.perf_counter() - t
  return ["chunk only (tree-sitter)", len(files), n_chunks, dt, len(files) / dt, n_chunks / dt]


def bench_ingest(files: list[pathlib.Path], workdir: pathlib.Path) -> list:
  src = workdir / "src"
  for f in files:
    dst = src / f.relative_to(stdlib_folder())
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(f, dst)
  embed = default_embedding_function()
  embed(["warm up the jit"] * 3)
  col = VectorStore(workdir / "store").get_or_create_collection("stdlib", embed)
  t = time.perf_counter()
  stats = ingest(src, col, progress=False)
  dt = time.perf_counter() - t
  t = time.perf_counter()
  again = ingest(src, col, progress=False)
  dt_again = time.perf_counter() - t
  assert again.chunks_upserted == 0
  return [["chunk + MiniLM embed + upsert", stats.files_ingested, stats.chunks_upserted, dt,
           stats.files_ingested / dt, stats.chunks_upserted / dt],
          ["re-ingest unchanged (hash skip)", again.files_skipped, 0, dt_again, again.files_skipped / dt_again, 0.0]]


def bench_queries(n: int, n_queries: int, workdir: pathlib.Path) -> tuple[list, float]:
  import faiss
  faiss.omp_set_num_threads(1)  # one query at a time: OpenMP threads only add overhead on a shared 2-core box
  rng = np.random.default_rng(0)
  col = VectorStore(workdir / "big").get_or_create_collection("synthetic", lambda texts: None)
  t = time.perf_counter()
  for start in range(0, n, 20_000):
    m = min(20_000, n - start)
    vecs = rng.normal(size=(m, 384)).astype(np.float32)
    ids = [f"c{start + i}" for i in range(m)]
    metas = [{"group": (start + i) % 100, "half": (start + i) % 2, "lang": "py"} for i in range(m)]
    col.add(ids, embeddings=vecs, documents=[f"chunk {start + i}" for i in range(m)], metadatas=metas)
  build = time.perf_counter() - t
  queries = rng.normal(size=(n_queries, 384)).astype(np.float32)
  rows = []
  for label, where in [("no filter", None), ("where group == 7 (1% pass)", {"group": 7}),
                       ("where half == 0 (50% pass)", {"half": 0}),
                       ("where group in [1..10] and half == 1 (5%)", {"$and": [{"group": {"$in": list(range(1, 11))}},
                                                                               {"half": 1}]})]:
    col.query(query_embeddings=queries[:1], n_results=10, where=where)
    times = []
    for q in queries:
      t = time.perf_counter()
      col.query(query_embeddings=q[None], n_results=10, where=where)
      times.append(time.perf_counter() - t)
    times = np.array(times) * 1e3
    rows.append([label, n, float(np.percentile(times, 50)), float(np.percentile(times, 99))])
  return rows, build


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--max-files", type=int, default=40)
  parser.add_argument("--n", type=int, default=100_000)
  parser.add_argument("--queries", type=int, default=200)
  args = parser.parse_args()
  all_files = walk(stdlib_folder())
  all_files = [f for f in all_files if f.suffix == ".py" and "test" not in f.relative_to(stdlib_folder()).parts[0]]
  with tempfile.TemporaryDirectory() as tmp:
    workdir = pathlib.Path(tmp)
    chunk_row = bench_chunking(all_files)
    print(chunk_row, flush=True)
    top_level = [f for f in all_files if f.parent == stdlib_folder()][:args.max_files]
    ingest_rows = bench_ingest(top_level, workdir)
    print(ingest_rows, flush=True)
    query_rows, build = bench_queries(args.n, args.queries, workdir)
    print(query_rows, build, flush=True)
  device = f"CPU, {os.cpu_count()} cores ({platform.processor() or platform.machine()}), python {platform.python_version()}"
  md = "\n\n".join([
      "## memory",
      f"Device: {device}. Command: `python benchmarks/memory.py --max-files {args.max_files} --n {args.n} "
      f"--queries {args.queries}`.",
      "Ingestion of the Python standard library (max_chars 1200 non-whitespace). Chunking alone covers every "
      "stdlib .py file outside test packages; the embedded ingest is capped at the first "
      f"{args.max_files} top-level modules (all-MiniLM-L6-v2, JAX backend, batch 64, max 256 tokens: embedding "
      "the whole library would take too long on 2 cores).",
      markdown_table(["stage", "files", "chunks", "seconds", "files/s", "chunks/s"], [chunk_row] + ingest_rows),
      f"Query latency, one query at a time, n_results=10, {args.n:,} chunks of synthetic 384-d unit vectors "
      f"(flat FAISS inner product on 1 OpenMP thread + SQLite metadata; building the store took {build:.1f} s):",
      markdown_table(["filter", "chunks", "p50 ms", "p99 ms"], query_rows),
  ])
  write_section("memory", md)
  print(md)


if __name__ == "__main__":
  main()
