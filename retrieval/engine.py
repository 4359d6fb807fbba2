"""Search engines over documents: "vector" (embedder + DenseIndex), "bm25" (BM25Index) and "hybrid"
(both, fused by weighted RRF or a convex combination), each with an optional cross-encoder reranker
(recall max(k, rerank_pool) candidates, rescore, keep k).
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from retrieval import fusion
from retrieval.bm25 import BM25Index
from retrieval.dense import DenseIndex
from retrieval.documents import Document, Hit, hit, to_documents

KINDS = ("vector", "bm25", "hybrid")


class SearchEngine:
  """Base: holds documents, turns (id, score) lists into Hits, applies the reranker."""

  def __init__(self, reranker=None, rerank_pool: int = 50):
    self.documents: dict[str, Document] = {}
    self.reranker, self.rerank_pool = reranker, rerank_pool

  def __len__(self) -> int:
    return len(self.documents)

  def _recall(self, queries: list[str], k: int) -> list[list[tuple[str, float]]]:
    raise NotImplementedError

  def add(self, documents: Iterable, **kwargs) -> None:
    raise NotImplementedError

  def search_batch(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
    """Per query, up to k Hits, best first (k is capped at the number of documents)."""
    if isinstance(queries, str):
      raise TypeError("queries must be a sequence of strings, not one string")
    queries = list(queries)
    for i, q in enumerate(queries):
      if not isinstance(q, str):
        raise TypeError(f"queries[{i}] is {type(q).__name__}, expected str")
    if k < 1:
      raise ValueError(f"k={k}: must be >= 1")
    if not queries or not self.documents:
      return [[] for _ in queries]
    k = min(k, len(self.documents))
    pool = max(k, self.rerank_pool) if self.reranker is not None else k
    results = [[hit(self.documents[d], s) for d, s in ranked[:pool]] for ranked in self._recall(queries, pool)]
    if self.reranker is not None:
      results = [self.reranker.rerank(q, hits, top_n=k) for q, hits in zip(queries, results)]
    return results

  def search(self, query: str, k: int = 10) -> list[Hit]:
    return self.search_batch([query], k)[0]


class VectorSearchEngine(SearchEngine):
  def __init__(self, embedder, index: DenseIndex | None = None, batch_size: int = 64, **kwargs):
    super().__init__(**kwargs)
    self.embedder, self.batch_size = embedder, batch_size
    self.index = index if index is not None else DenseIndex(embedder.dim)

  def add(self, documents: Iterable, embeddings: np.ndarray | None = None, show_progress: bool | None = None):
    """Upserts documents; `embeddings` [N, d] (in document order) skips encoding."""
    docs = to_documents(documents)
    if embeddings is None:
      embeddings = self.embedder.encode([d.indexed_text for d in docs], self.batch_size, show_progress)
    elif np.shape(embeddings) != (len(docs), self.index.dim):
      raise ValueError(f"embeddings shape {np.shape(embeddings)} != ({len(docs)}, {self.index.dim})")
    self.index.upsert([d.id for d in docs], embeddings)
    self.documents.update((d.id, d) for d in docs)

  def _recall(self, queries, k):
    return self.index.search(self.embedder.encode(queries, self.batch_size, False), k)


class BM25SearchEngine(SearchEngine):
  def __init__(self, bm25: BM25Index | None = None, **kwargs):
    super().__init__(**kwargs)
    self.bm25 = bm25 if bm25 is not None else BM25Index()

  def add(self, documents: Iterable, **_):
    """Upserts documents and rebuilds the (static) BM25 index."""
    self.documents.update((d.id, d) for d in to_documents(documents))
    self.bm25.index(list(self.documents), [d.indexed_text for d in self.documents.values()])

  def _recall(self, queries, k):
    return self.bm25.search(queries, k)


class HybridSearchEngine(SearchEngine):
  """Fuses a vector and a BM25 engine: fusion "rrf" (k=rrf_k) or "convex"; weights (vector, bm25)."""

  def __init__(self, vector: VectorSearchEngine, bm25: BM25SearchEngine, fusion: str = "rrf",
               weights: Sequence[float] = (1.0, 1.0), window: int = 100, rrf_k: float = 60.0, **kwargs):
    super().__init__(**kwargs)
    if fusion not in ("rrf", "convex"):
      raise ValueError(f"fusion={fusion!r}: choose 'rrf' or 'convex'")
    self.vector, self.bm25 = vector, bm25
    self.fusion, self.weights, self.window, self.rrf_k = fusion, tuple(weights), window, rrf_k

  def add(self, documents: Iterable, embeddings: np.ndarray | None = None, show_progress: bool | None = None):
    docs = to_documents(documents)
    self.vector.add(docs, embeddings=embeddings, show_progress=show_progress)
    self.bm25.add(docs)
    self.documents.update((d.id, d) for d in docs)

  def _recall(self, queries, k):
    window = max(self.window, k)
    dense, lexical = self.vector._recall(queries, window), self.bm25._recall(queries, window)
    if self.fusion == "rrf":
      fuse = lambda a, b: fusion.rrf([a, b], self.weights, k=self.rrf_k, window=window)
    else:
      fuse = lambda a, b: fusion.convex_combination([a, b], self.weights, window=window)
    return [fuse(a, b)[:k] for a, b in zip(dense, lexical)]


def create_search_engine(kind: str, documents: Iterable | None = None, *, embedder: Any = "all-MiniLM-L6-v2",
                         reranker=None, rerank_pool: int = 50, embeddings: np.ndarray | None = None,
                         index_kind: str = "auto", batch_size: int = 64, show_progress: bool | None = None,
                         bm25: dict | None = None, fusion: str = "rrf", weights: Sequence[float] = (1.0, 1.0),
                         window: int = 100, rrf_k: float = 60.0) -> SearchEngine:
  """Builds a "vector" | "bm25" | "hybrid" engine and indexes `documents` (dicts or strings).

  embedder: an Embedder or a model path/alias (loaded with the JAX backend); embeddings: precomputed
  document vectors [N, d] in document order; bm25: BM25Index options (method, k1, b, stopwords, stemmer);
  reranker: a CrossEncoderReranker, applied to the top max(k, rerank_pool) candidates.
  """
  if kind not in KINDS:
    raise ValueError(f"kind={kind!r}: choose one of {KINDS}")
  common = dict(reranker=reranker, rerank_pool=rerank_pool)

  def make_vector(**kw):
    emb = embedder
    if isinstance(emb, str):
      from retrieval.embedder import Embedder
      emb = Embedder.from_pretrained(emb)
    return VectorSearchEngine(emb, DenseIndex(emb.dim, index_kind), batch_size=batch_size, **kw)

  if kind == "vector":
    engine: SearchEngine = make_vector(**common)
  elif kind == "bm25":
    engine = BM25SearchEngine(BM25Index(**(bm25 or {})), **common)
  else:
    engine = HybridSearchEngine(make_vector(), BM25SearchEngine(BM25Index(**(bm25 or {}))), fusion=fusion,
                                weights=weights, window=window, rrf_k=rrf_k, **common)
  if documents is not None:
    if kind == "bm25":
      engine.add(documents)
    else:
      engine.add(documents, embeddings=embeddings, show_progress=show_progress)
  return engine
