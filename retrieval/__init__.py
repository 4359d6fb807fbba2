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
  faiss_threads(n | num_queries=Q, num_vectors=n, dim=d): context manager, FAISS OpenMP threads in this
      thread; DenseIndex.search uses threads_for(Q, n, d): 1 unless Q >= 2 and Q*n*d >= MIN_PARALLEL_WORK
  server: python -m retrieval.server --corpus FILE.jsonl --kind hybrid --port 8000
      (POST /retrieve, Search-R1 schema); retrieve_http(url, queries, topk=3) (RetrievalHTTPError: .status)
  prebuilt (Search-R1's e5_Flat.index + wiki-18.jsonl layout, nothing re-embedded):
      python -m retrieval.build_index --corpus FILE.jsonl --out DIR [--embedder PATH]
      python -m retrieval.server --index DIR/NAME_Flat.index --corpus FILE.jsonl
      load_prebuilt(index, corpus) -> PrebuiltEngine; JsonlCorpus(path)[i] (byte-offset index, memory-mapped)
"""
import importlib

_EXPORTS = {
    "BM25Index": "retrieval.bm25", "DenseIndex": "retrieval.dense", "Document": "retrieval.documents",
    "Hit": "retrieval.documents", "read_jsonl": "retrieval.documents", "to_documents": "retrieval.documents",
    "Embedder": "retrieval.embedder", "BM25SearchEngine": "retrieval.engine",
    "HybridSearchEngine": "retrieval.engine", "SearchEngine": "retrieval.engine",
    "VectorSearchEngine": "retrieval.engine", "create_search_engine": "retrieval.engine",
    "convex_combination": "retrieval.fusion", "rrf": "retrieval.fusion",
    "CrossEncoderReranker": "retrieval.rerank", "retrieve_http": "retrieval.server",
    "faiss_threads": "retrieval.threads", "threads_for": "retrieval.threads",
    "JsonlCorpus": "retrieval.jsonl_corpus", "PrebuiltEngine": "retrieval.prebuilt", "load_prebuilt": "retrieval.prebuilt",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  """Lazy exports: `import retrieval` stays cheap; bm25s, JAX and faiss load on first use."""
  if name not in _EXPORTS:
    raise AttributeError(f"module 'retrieval' has no attribute {name!r}")
  return getattr(importlib.import_module(_EXPORTS[name]), name)
