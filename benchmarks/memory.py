"""Memory layer speed on CPU: chunking and ingestion of the Python standard library; VectorStore write
cost and query latency (one FAISS thread vs FAISS's default) at 10k / 100k 384-d vectors; recall@10 of the
IVF index at 1M vectors.

  python -m benchmarks.memory [--max-files 12] [--sizes 10000,100000] [--recall-n 1000000] [--queries 100]

Ingestion embeds with all-MiniLM-L6-v2 (retrieval.embedder, JAX backend); it is capped at --max-files
files because embedding the whole library takes too long on 2 cores. Chunking alone runs on all files.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import platform
import shutil
import sysconfig
import tempfile
import time

import numpy as np


from benchmarks._results import markdown_table, write_section
from memory.chunking import chunk_file
from memory.ingest import ingest, walk
from memory.store import VectorStore, default_embedding_function


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


SIGMA = {"clustered": 0.5, "clustered-hard": 1.0}


def vectors(n: int, dim: int, data: str, seed: int) -> np.ndarray:
  """Synthetic vectors: "gaussian" (i.i.d. N(0, 1), the hardest case for an approximate index) or
  "clustered" / "clustered-hard" (2000 cluster centres ~ N(0, 1), points = centre + N(0, sigma^2) per
  dimension, sigma 0.5 / 1.0)."""
  rng = np.random.default_rng(seed)
  if data == "gaussian":
    return rng.normal(size=(n, dim)).astype(np.float32)
  centres = np.random.default_rng(12345).normal(size=(2000, dim)).astype(np.float32)
  out = np.empty((n, dim), np.float32)
  for a in range(0, n, 100_000):
    b = min(n, a + 100_000)
    out[a:b] = centres[rng.integers(0, 2000, b - a)] + SIGMA[data] * rng.normal(size=(b - a, dim)).astype(np.float32)
  return out


def exact_top(x: np.ndarray, q: np.ndarray, k: int = 10) -> list[set]:
  """Row indices of the k nearest rows of x by cosine distance, per query (x scanned in blocks)."""
  from memory.index import unit
  qs = unit(q)
  best_s = np.full((len(q), k), -np.inf, np.float32)
  best_i = np.zeros((len(q), k), np.int64)
  for a in range(0, len(x), 100_000):
    s = qs @ unit(x[a:a + 100_000]).T
    s_all = np.concatenate([best_s, s], 1)
    i_all = np.concatenate([best_i, np.arange(a, a + s.shape[1])[None].repeat(len(q), 0)], 1)
    top = np.argpartition(-s_all, k - 1, axis=1)[:, :k]
    best_s, best_i = np.take_along_axis(s_all, top, 1), np.take_along_axis(i_all, top, 1)
  return [set(row.tolist()) for row in best_i]


def timed(fn, reps: int) -> np.ndarray:
  out = []
  for i in range(reps):
    t = time.perf_counter()
    fn(i)
    out.append(time.perf_counter() - t)
  return np.array(out) * 1e3


def folder_mb(path: pathlib.Path) -> float:
  return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def fill(col, x: np.ndarray, metas: bool = True) -> float:
  t = time.perf_counter()
  for start in range(0, len(x), 20_000):
    m = min(20_000, len(x) - start)
    ids = [f"c{start + i}" for i in range(m)]
    meta = [{"group": (start + i) % 100, "half": (start + i) % 2, "lang": "py"} for i in range(m)] if metas else None
    col.add(ids, embeddings=x[start:start + m], documents=[f"chunk {start + i}" for i in range(m)], metadatas=meta)
  return time.perf_counter() - t


def bench_store(sizes: list[int], n_queries: int, data: str, workdir: pathlib.Path) -> tuple[list, list, list]:
  """Write cost and query latency of VectorStore collections (cosine, 384-d)."""
  import memory.threads
  write_rows, query_rows, filter_rows = [], [], []
  q = vectors(n_queries, 384, data, seed=99)
  for n in sizes:
    x = vectors(n, 384, data, seed=n)
    truth = exact_top(x, q)
    for kind, fsync in (("flat", True), ("auto", True), ("auto", False)):
      path = workdir / f"store-{n}-{kind}"
      col = VectorStore(path, fsync=fsync).get_or_create_collection(
          "bench", lambda t: None, metadata={"hnsw:space": "cosine", "index:kind": kind})
      build = fill(col, x)
      structure = col.index().structure
      new = vectors(60, 384, data, seed=7)
      one = timed(lambda i: col.upsert([f"new{i}"], embeddings=new[i:i + 1], documents=["x"],
                                       metadatas=[{"group": 1}]), 30)
      again = timed(lambda i: col.upsert([f"c{i}"], embeddings=new[30 + i:31 + i]), 30)
      batch = timed(lambda i: col.upsert([f"b{i}-{j}" for j in range(100)], embeddings=vectors(100, 384, data, i),
                                         metadatas=[{"group": 2}] * 100), 5)
      col.delete(ids=[f"new{i}" for i in range(30)] + [f"b{i}-{j}" for i in range(5) for j in range(100)])
      t = time.perf_counter()
      reopened = VectorStore(path).get_collection("bench", lambda t: None)
      reopened.index()
      open_s = time.perf_counter() - t
      write_rows.append([n, f"{kind} ({structure})", "fsync" if fsync else "no fsync", float(np.median(one)), float(np.percentile(one, 99)),
                         float(np.median(again)), float(np.median(batch)), build, open_s, folder_mb(path)])
      col.upsert([f"c{i}" for i in range(30)], embeddings=x[:30])  # restore the vectors overwritten above
      if not fsync:  # same index as the row above: queries were measured there
        col.store.close()
        reopened.store.close()
        shutil.rmtree(path)
        continue
      for threads_label, batch_size in (("1 thread", memory.threads.BATCH), ("default threads", 0)):
        memory.threads.BATCH = batch_size
        col.query(query_embeddings=q[:1], n_results=10)
        got = []
        times = timed(lambda i: got.append(col.query(query_embeddings=q[i:i + 1], n_results=10,
                                                     include=())["ids"][0]), n_queries)
        memory.threads.BATCH = 8
        recall = np.mean([len({int(s[1:]) for s in g} & t) / 10 for g, t in zip(got, truth)])
        query_rows.append([n, f"{kind} ({structure})", threads_label, float(np.median(times)),
                           float(np.percentile(times, 99)), float(recall)])
      if n == max(sizes) and kind == "auto":
        for label, where in [("where group == 7 (1% pass)", {"group": 7}), ("where half == 0 (50% pass)", {"half": 0}),
                             ("where group in [1..10] and half == 1 (5%)",
                              {"$and": [{"group": {"$in": list(range(1, 11))}}, {"half": 1}]})]:
          col.query(query_embeddings=q[:1], n_results=10, where=where)
          times = timed(lambda i: col.query(query_embeddings=q[i:i + 1], n_results=10, where=where), n_queries)
          filter_rows.append([label, n, float(np.median(times)), float(np.percentile(times, 99))])
      col.store.close()
      reopened.store.close()
      shutil.rmtree(path)
  return write_rows, query_rows, filter_rows


def bench_ivf_recall(n: int, n_queries: int, data: str) -> list:
  """recall@10 and one-query latency of the IVF index alone (memory.index.VectorIndex) at n vectors:
  centroids trained once on the whole set (64 x nlist sampled vectors), then vectors added in blocks."""
  from memory.index import VectorIndex
  x = vectors(n, 384, data, seed=n + 1)
  q = vectors(n_queries, 384, data, seed=98)
  truth = exact_top(x, q)
  t = time.perf_counter()
  nlist = int(np.clip(np.sqrt(n), 16, 4096))
  sample = np.sort(np.random.default_rng(0).choice(n, min(n, 64 * nlist), replace=False))
  centroids = VectorIndex(384, "cosine", "ivf").train(VectorIndex(384, "cosine").prepare(x[sample]), n=n)
  index = VectorIndex(384, "cosine", "ivf", centroids=centroids, trained_n=n)
  for start in range(0, n, 100_000):
    index.upsert([str(i) for i in range(start, min(n, start + 100_000))], x[start:start + 100_000])
  build = time.perf_counter() - t
  del x
  rows = []
  for nprobe in (8, 16, 32, 64):
    index._ivf.nprobe = nprobe
    got = []
    times = timed(lambda i: got.append(index.search(q[i], 10)[0]), n_queries)
    recall = np.mean([len({int(h[0]) for h in g} & t) / 10 for g, t in zip(got, truth)])
    rows.append([n, data, index._ivf.nlist, nprobe, float(recall), float(np.median(times)), build])
  return rows


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--max-files", type=int, default=12, help="files embedded in the ingest row (0: skip)")
  parser.add_argument("--sizes", default="10000,100000", help="store sizes for write cost and query latency")
  parser.add_argument("--recall-n", type=int, default=1_000_000, help="IVF recall measurement size (0: skip)")
  parser.add_argument("--queries", type=int, default=100)
  parser.add_argument("--data", default="clustered", choices=("clustered", "clustered-hard", "gaussian"))
  parser.add_argument("--recall-only", default="", help="comma-separated data kinds: only the IVF recall table")
  parser.add_argument("--no-write", action="store_true", help="print the tables without writing RESULTS.md")
  args = parser.parse_args()
  sizes = [int(v) for v in args.sizes.split(",")]
  load_before = os.getloadavg()[0]
  if args.recall_only:
    from benchmarks._results import markdown_table as table
    rows = [r for data in args.recall_only.split(",") for r in bench_ivf_recall(args.recall_n, args.queries, data)]
    print(f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
    print(table(["vectors", "data", "nlist", "nprobe", "recall@10", "p50 ms", "build s"], rows))
    return
  all_files = walk(stdlib_folder())
  all_files = [f for f in all_files if f.suffix == ".py" and "test" not in f.relative_to(stdlib_folder()).parts[0]]
  with tempfile.TemporaryDirectory() as tmp:
    workdir = pathlib.Path(tmp)
    chunk_row = bench_chunking(all_files)
    print(chunk_row, flush=True)
    ingest_rows = []
    if args.max_files:
      top_level = [f for f in all_files if f.parent == stdlib_folder()][:args.max_files]
      ingest_rows = bench_ingest(top_level, workdir)
      print(ingest_rows, flush=True)
    write_rows, query_rows, filter_rows = bench_store(sizes, args.queries, args.data, workdir)
    print(write_rows, query_rows, filter_rows, flush=True)
  recall_rows = []
  for data in ("clustered", "gaussian"):
    n = args.recall_n if data == "clustered" else min(args.recall_n, max(sizes))
    if n:
      recall_rows += bench_ivf_recall(n, args.queries, data)
      print(recall_rows[-4:], flush=True)
  device = f"2-core CPU, this machine ({platform.processor() or platform.machine()}, {os.cpu_count()} cores " \
           f"shared with other jobs; 1-minute load average {load_before:.1f} at the start, " \
           f"{os.getloadavg()[0]:.1f} at the end), python {platform.python_version()}"
  command = f"`python -m benchmarks.memory --max-files {args.max_files} --sizes {args.sizes} " \
            f"--recall-n {args.recall_n} --queries {args.queries} --data {args.data}`"
  md = "\n\n".join([
      "## memory",
      f"Device: {device}. Command: {command}.",
      "Ingestion of the Python standard library (max_chars 1200 non-whitespace). Chunking alone covers every "
      "stdlib .py file outside test packages; the embedded ingest is capped at the first "
      f"{args.max_files} top-level modules (all-MiniLM-L6-v2, JAX backend, batch 64, max 256 tokens).",
      markdown_table(["stage", "files", "chunks", "seconds", "files/s", "chunks/s"], [chunk_row] + ingest_rows),
      f"Write cost of a VectorStore collection (384-d {args.data} synthetic vectors, hnsw:space cosine, 3 metadata "
      "keys): a write is one SQLite transaction (WAL, synchronous=FULL: fsynced) plus an O(batch) update of the "
      "in-memory index; nothing is re-saved (\"no fsync\": VectorStore(fsync=False), SQLite synchronous=NORMAL: "
      "a returned write survives a killed process but not a power cut). one-record upsert: a new id with document and metadata (30 calls); "
      "upsert existing: a stored id's embedding replaced (30 calls); open: a new process's index build from "
      "SQLite. index kind \"auto\" turns IVF at 50,000 vectors.",
      markdown_table(["records", "index", "durability", "1-record upsert p50 ms", "p99 ms", "upsert existing p50 ms",
                      "100-record upsert p50 ms", "fill s", "open s", "disk MB"], write_rows),
      f"Query latency, one query at a time, n_results=10, unfiltered ({args.queries} queries). \"1 thread\": "
      "FAISS on one OpenMP thread (what the store does for fewer than 8 queries, memory.threads); \"default "
      "threads\": FAISS's OpenMP default. recall@10 against exact cosine search.",
      markdown_table(["records", "index", "FAISS threads", "p50 ms", "p99 ms", "recall@10"], query_rows),
      f"Filtered queries at {max(sizes):,} records (index auto; SQLite metadata filter, exact scoring of the "
      "passing records when at most max(4096, n/4) pass, else post-filtered index candidates):",
      markdown_table(["filter", "records", "p50 ms", "p99 ms"], filter_rows),
      "Approximate index (memory.index.VectorIndex kind ivf, cosine, 384-d; nlist = sqrt(n) trained on "
      "64 x nlist vectors): recall@10 against exact search and one-query latency (1 thread) by nprobe. "
      "Gaussian data (i.i.d., no structure) is the worst case for any approximate index; real embeddings "
      "behave like the clustered set only roughly, so tune `index:nprobe` on your data.",
      markdown_table(["vectors", "data", "nlist", "nprobe", "recall@10", "p50 ms", "build s"], recall_rows),
  ])
  if not args.no_write:
    write_section("memory", md)
  print(md)


if __name__ == "__main__":
  main()
