"""SciFact retrieval quality and speed: BM25 (bm25s vs rank-bm25), dense (all-MiniLM-L6-v2), hybrid RRF.

Queries: SciFact training claims grouped by id; qrels: their cited_doc_ids (binary relevance).
Documents: title + " " + " ".join(sentences); corpus embeddings from the cached .npy (queries are encoded).
  nDCG@10 = DCG@10 / IDCG@10 with DCG = sum_{r<=10} rel_r / log2(r + 1);  Recall@100 = |rel ∩ top100| / |rel|.

Server load test (benchmarks/retrieval_load.py: `python -m retrieval.server --kind bm25` in a subprocess on
127.0.0.1, bounded loops) and FAISS single-query latency with one thread vs the default thread count.

  python -m benchmarks.retrieval [--part all|quality|server|faiss] [--rank-bm25-queries 100]
"""
from __future__ import annotations

import argparse
import ast
import os
import pathlib
import time

import numpy as np
import pandas as pd

from benchmarks import retrieval_load
from benchmarks._results import markdown_table, write_section
from retrieval import create_search_engine, fusion

SHARED = pathlib.Path(os.environ.get("FINEFLAX_SHARED", pathlib.Path(__file__).resolve().parents[1] / "../shared"))
DATA = SHARED / "data" / "scifact"


def load_scifact():
  corpus = pd.read_csv(DATA / "corpus.csv.gz")
  docs = [{"id": str(r.doc_id), "title": r.title, "text": " ".join(ast.literal_eval(r.abstract))}
          for r in corpus.itertuples()]
  claims = pd.read_csv(DATA / "claims_train.csv.gz")
  queries, qrels = [], []
  for _, group in claims.groupby("id", sort=True):
    cited = set()
    for c in group.cited_doc_ids:
      cited.update(c.strip("[]").split())
    if cited:
      queries.append(group.claim.iloc[0])
      qrels.append(cited)
  embeddings = np.load(DATA / "corpus_all-MiniLM-L6-v2.npy")
  assert embeddings.shape[0] == len(docs), (embeddings.shape, len(docs))
  return docs, queries, qrels, embeddings


def ndcg_at_k(ranked: list[str], relevant: set[str], k: int = 10) -> float:
  dcg = sum(1.0 / np.log2(r + 2) for r, d in enumerate(ranked[:k]) if d in relevant)
  idcg = sum(1.0 / np.log2(r + 2) for r in range(min(k, len(relevant))))
  return dcg / idcg


def recall_at_k(ranked: list[str], relevant: set[str], k: int = 100) -> float:
  return len(set(ranked[:k]) & relevant) / len(relevant)


def evaluate(run: list[list[str]], qrels) -> tuple[float, float]:
  return (float(np.mean([ndcg_at_k(r, q) for r, q in zip(run, qrels)])),
          float(np.mean([recall_at_k(r, q) for r, q in zip(run, qrels)])))


def timed(fn):
  start = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - start


def device() -> str:
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  return f"CPU, {len(os.sched_getaffinity(0))} cores shared with other jobs (1-min load average {load:.1f} at the start)"


def server_section(docs, queries, n: int, runs: int = 3) -> str:
  load = device()
  results = [retrieval_load.server_rows(docs, queries, n) for _ in range(runs)]  # a fresh server each time
  rates = [r[0][0][4] for r in results]
  rows, notes = results[int(np.argsort(rates)[len(rates) // 2])]  # the run with the median keep-alive req/s
  each = "; ".join(f"{r[0][0][4]:.0f} req/s, {r[0][0][8]:.2f} server CPU ms/request" for r in results)
  header = ["load", "clients", "requests", "errors", "req/s (median run)", "req/s (best run)", "p50 ms", "p99 ms",
            "server CPU ms/request"]
  table = markdown_table(header, rows)
  print(table, *notes, sep="\n")
  base, idle = rows[3][6], rows[4][6]
  return "\n".join([
      "### Retrieval server under load (`python -m retrieval.server --kind bm25`, SciFact corpus)",
      "",
      f"Starlette + uvicorn (httptools) in a subprocess on 127.0.0.1, --workers 2; clients are Python "
      f"http.client threads in the benchmark process; queries are SciFact claims, topk 3, return_scores true.",
      "",
      table,
      "",
      f"32 idle connections moved a normal request's p50 by {idle - base:+.1f} ms (target: under 100 ms; the two "
      "rows alternate in 5 blocks). Server CPU ms/request (user + system time of the server process) varies "
      "far less with the machine's load than req/s, which other jobs on these 2 cores cut (the 500 req/s "
      "target needs about 2 ms per request end to end, server and client together). "
      f"The table is the median of {runs} runs (each with a fresh server) by one-client keep-alive req/s; "
      f"the runs gave {each}. Malformed requests: {notes[0]}{'; ' + '; '.join(notes[1:]) if len(notes) > 1 else ''}. "
      "Before (http.server, 8 threads; issue 14's audit, not re-measured here): ~22 req/s for one keep-alive "
      "client (a 40 ms Nagle/delayed-ACK stall per request), and 8 idle connections hung the server.",
      "",
      f"Device: {load}. Command: `python -m benchmarks.retrieval --part server`",
  ])


def faiss_section(embeddings) -> str:
  load = device()
  rng = np.random.default_rng(0)
  synthetic = rng.standard_normal((100_000, embeddings.shape[1])).astype(np.float32)
  synthetic /= np.linalg.norm(synthetic, axis=1, keepdims=True)
  rows = retrieval_load.faiss_rows(embeddings.astype(np.float32), "SciFact MiniLM") + \
      retrieval_load.faiss_rows(synthetic, "random unit 384-d", batch_sizes=(1, 4, 16, 64))
  header = ["vectors", "n", "queries/call", "1 thread ms", "default threads ms", "auto threads",
            "auto ms", "default / 1 thread"]
  table = markdown_table(header, rows)
  print(table)
  from retrieval.threads import MIN_PARALLEL_WORK, default_threads
  return "\n".join([
      "### FAISS threads per call (DenseIndex.search, flat inner product, k=10)",
      "",
      f"Median ms per call. default = {default_threads()} OpenMP threads (FAISS's default); auto = "
      f"`retrieval.threads.threads_for(Q, n, d)`, which DenseIndex.search now uses: 1 thread unless Q >= 2 and "
      f"Q * n * d >= {MIN_PARALLEL_WORK:.3g} multiply-adds, else the default. One query: one thread is "
      "2.5-80x faster; from about 1e8 multiply-adds per call two threads win. Where auto picks the same count "
      "as another column, the two timings show the run-to-run noise on these shared cores (tens of percent; "
      "calls longer than a scheduler slice are stretched by the other jobs).",
      "",
      table,
      "",
      f"Device: {load}. Command: `python -m benchmarks.retrieval --part faiss`",
  ])


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--part", default="all", choices=("all", "quality", "server", "faiss"))
  p.add_argument("--server-requests", type=int, default=1000, help="requests per run of the keep-alive client")
  p.add_argument("--server-runs", type=int, default=3, help="server load tests (fresh server each)")
  p.add_argument("--rank-bm25-queries", type=int, default=100)
  p.add_argument("--k1", type=float, default=1.2)
  p.add_argument("--b", type=float, default=0.75)
  p.add_argument("--window", type=int, default=100)
  p.add_argument("--weights", type=float, nargs=2, default=(1.0, 1.0), help="RRF weights (dense, bm25)")
  p.add_argument("--no-write", action="store_true")
  args = p.parse_args()
  docs, queries, qrels, embeddings = load_scifact()
  if args.part in ("all", "server"):
    md = server_section(docs, queries, args.server_requests, args.server_runs)
    if not args.no_write:
      write_section("retrieval-server", md)
  if args.part in ("all", "faiss"):
    md = faiss_section(embeddings)
    if not args.no_write:
      write_section("retrieval-faiss", md)
  if args.part in ("all", "quality"):
    quality(args, docs, queries, qrels, embeddings)


def quality(args, docs, queries, qrels, embeddings):
  from retrieval.embedder import Embedder
  load = device()
  nq = len(queries)
  print(f"{len(docs)} docs, {nq} queries", flush=True)
  embedder = Embedder.from_pretrained("all-MiniLM-L6-v2")
  bm25_opts = {"method": "lucene", "k1": args.k1, "b": args.b, "stopwords": "en", "stemmer": "english"}
  engine = create_search_engine("hybrid", docs, embedder=embedder, embeddings=embeddings, bm25=bm25_opts,
                                weights=args.weights, window=args.window)
  embedder.encode(queries[:64])  # compile outside the timing

  rows = []
  lexical, t_bm25 = timed(lambda: engine.bm25.bm25.search(queries, 100))
  rows.append(["BM25 (bm25s, lucene, stem+stop)", *evaluate([[d for d, _ in r] for r in lexical], qrels),
               nq / t_bm25])
  query_vecs, t_enc = timed(lambda: embedder.encode(queries, batch_size=64, show_progress=False))
  dense, t_search = timed(lambda: engine.vector.index.search(query_vecs, 100))
  rows.append(["Dense (all-MiniLM-L6-v2, FAISS flat IP)", *evaluate([[d for d, _ in r] for r in dense], qrels),
               nq / (t_enc + t_search)])
  t_both = t_bm25 + t_enc + t_search
  variants = [(f"Hybrid RRF (k=60, window {args.window}, w=dense {args.weights[0]:g}, bm25 {args.weights[1]:g})",
               lambda a, b: fusion.rrf([a, b], args.weights, k=60, window=args.window)),
              (f"Hybrid RRF (k=60, window {args.window}, w=dense 1, bm25 1.5)*",
               lambda a, b: fusion.rrf([a, b], (1.0, 1.5), k=60, window=args.window)),
              ("Hybrid min-max convex 0.5/0.5 (window 100)*",
               lambda a, b: fusion.convex_combination([a, b], (0.5, 0.5), window=100))]
  for name, fuse in variants:
    fused, t_fuse = timed(lambda: [fuse(a, b) for a, b in zip(dense, lexical)])
    rows.append([name, *evaluate([[d for d, _ in r] for r in fused], qrels), nq / (t_both + t_fuse)])

  import rank_bm25
  tokens = engine.bm25.bm25.tokenize([d["title"] + " " + d["text"] for d in docs])
  okapi = rank_bm25.BM25Okapi(tokens, k1=args.k1, b=args.b)
  ids = [d["id"] for d in docs]
  sub = queries[:args.rank_bm25_queries]
  q_tokens = engine.bm25.bm25.tokenize(sub)
  ref_run, t_ref = timed(lambda: [[ids[i] for i in np.argsort(-okapi.get_scores(q))[:100]] for q in q_tokens])
  ref_qps = len(sub) / t_ref
  sub_bm25 = evaluate([[d for d, _ in r] for r in lexical[:len(sub)]], qrels[:len(sub)])[0]
  rows.append([f"BM25 (rank-bm25 Okapi; first {len(sub)} queries)", *evaluate(ref_run, qrels[:len(sub)]), ref_qps])
  header = ["retriever", "nDCG@10", "Recall@100", "queries/s"]
  table = markdown_table(header, rows)
  print(table)
  print(f"bm25s / rank-bm25 speed: {rows[0][3] / ref_qps:.1f}x; bm25s nDCG@10 on the same subset {sub_bm25:.3f}")
  md = "\n".join([
      "## Retrieval on SciFact (Wadden et al. 2020)",
      "",
      f"{nq} SciFact training claims (grouped by id) against {len(docs)} abstracts; qrels = cited_doc_ids. "
      "Dense uses the cached all-MiniLM-L6-v2 corpus embeddings; query encoding (JAX) is inside the timing. "
      "Single-threaded BM25 retrieval; rank-bm25 timed on a subset (same tokens, argsort of full scores).",
      "",
      table,
      "",
      f"bm25s answers {rows[0][3] / ref_qps:.0f}x more queries/s than rank-bm25. Rows marked * use fusion "
      "settings picked by a small sweep on these same claims (no held-out split), so they are optimistic; "
      "BM25 k1 in {0.9, 1.2, 1.5} x b in {0.75, 0.9, 1.0} moved nDCG@10 by under 0.003. Dense/hybrid q/s are "
      "bound by JAX query encoding on 2 shared cores.",
      "",
      f"Device: {load}. Command: `python -m benchmarks.retrieval --part quality` (BM25 is timed on the "
      "per-query path, without bm25s' progress bars and JAX top-k: 757 queries/s before this change).",
  ])
  if not args.no_write:
    write_section("retrieval", md)


if __name__ == "__main__":
  main()
