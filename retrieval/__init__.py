"""fineflax retrieval: NumPy/FAISS/bm25s search layer (no JAX training code).

API
  Embedder.from_pretrained(path_or_alias="all-MiniLM-L6-v2", backend="jax"|"sentence-transformers",
                           max_length=256).encode(texts, batch_size=64, show_progress=None) -> f32 [N, dim]
  CrossEncoderReranker.from_pretrained(path, backend="jax"|"sentence-transformers", activation="auto")
      .score(query, texts) -> f32 [N];  .rerank(query, hits, top_n) -> list[Hit]
  DenseIndex(dim, kind="auto"|"flat"|"ivf"|"hnsw"): add/upsert(ids, vecs), delete(ids) -> int,
      search(query_vecs, k) -> [[(id, score)]], get(ids), save(path), DenseIndex.load(path)
  BM25Index(method="lucene"|"robertson"|"bm25l"|"bm25+", k1=1.5, b=0.75, stopwords="en", stemmer="english"):
      index(ids, texts), search(queries, k) -> [[(id, score)]], get_scores(query), save/load
  fusion.rrf(rankings, weights=None, k=60, window=100), fusion.convex_combination(rankings, weights, window)
  create_search_engine("vector"|"bm25"|"hybrid", documents, **options) -> engine with
      search(query, k) -> [Hit], search_batch(queries, k) -> [[Hit]], add(documents)
  Hit(id, score, text, metadata, title); Document(id, text, title, metadata)
  server: python -m retrieval.server --corpus FILE.jsonl --kind hybrid --port 8000
      (POST /retrieve, Search-R1 schema); retrieve_http(url, queries, topk=3)
"""
from retrieval.bm25 import BM25Index
from retrieval.dense import DenseIndex
from retrieval.documents import Document, Hit, read_jsonl, to_documents
from retrieval.embedder import Embedder
from retrieval.engine import (BM25SearchEngine, HybridSearchEngine, SearchEngine, VectorSearchEngine,
                              create_search_engine)
from retrieval.fusion import convex_combination, rrf
from retrieval.rerank import CrossEncoderReranker

__all__ = ["BM25Index", "DenseIndex", "Document", "Hit", "read_jsonl", "to_documents", "Embedder",
           "BM25SearchEngine", "HybridSearchEngine", "SearchEngine", "VectorSearchEngine",
           "create_search_engine", "convex_combination", "rrf", "CrossEncoderReranker", "retrieve_http"]


def __getattr__(name):
  if name == "retrieve_http":  # lazy: keeps http imports out of library use
    from retrieval.server import retrieve_http
    return retrieve_http
  raise AttributeError(name)
