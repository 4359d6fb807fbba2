"""The retrievers of RAG variants: anything with `search_batch(queries, k) -> [[retrieval.Hit]]`, best first.

  {"kind", "corpus", ...}         `retrieval.create_search_engine(kind, read_jsonl(corpus), ...)` itself
  {"url": ".../retrieve"}         `HttpRetriever`: a Search-R1 /retrieve server (`retrieval.server`)
  {"store": DIR, "collection"}    `CollectionRetriever`: a `memory.store.VectorStore` collection's query
A passage is recorded as {"id", "title", "text"} (`passage_record`).
"""
from __future__ import annotations

from typing import Sequence

from retrieval.documents import Hit


def passage_record(hit) -> dict:
  return {"id": str(hit.id), "title": str(getattr(hit, "title", "") or ""), "text": str(hit.text)}


class HttpRetriever:
  """A Search-R1 /retrieve endpoint; each result's document id, title (first line of `contents`) and text."""

  def __init__(self, url: str, timeout: float = 60.0):
    self.url, self.timeout = url, timeout

  def search_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
    from retrieval.server import retrieve_http
    out = []
    for row in retrieve_http(self.url, list(queries), topk=k, timeout=self.timeout):
      hits = []
      for item in row:
        doc = item.get("document", item)
        title, _, text = str(doc.get("contents", "")).partition("\n")
        if "text" in doc:
          title, text = str(doc.get("title", "")), str(doc["text"])
        hits.append(Hit(str(doc.get("id", "")), float(item.get("score", 0.0)), text, {}, title.strip().strip('"')))
      out.append(hits)
    return out


class CollectionRetriever:
  """A `memory` collection: hits in its query order, score = -distance, title from metadata["title"]."""

  def __init__(self, collection):
    self.collection = collection

  def search_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
    res = self.collection.query(query_texts=list(queries), n_results=k)
    return [[Hit(i, -float(dist), doc or "", dict(meta or {}), str((meta or {}).get("title", "")))
             for i, doc, meta, dist in zip(*(res[f][q] for f in ("ids", "documents", "metadatas", "distances")))]
            for q in range(len(queries))]


def build_retriever(spec: dict, *, embedder=None):
  """The retriever of a checked spec (`fineflax.rag.spec.retriever_from`). embedder: an Embedder (or a
  callable texts -> vectors for a store) to use instead of the spec's "embedder" (tests, shared models)."""
  if spec.get("url"):
    return HttpRetriever(spec["url"])
  if spec.get("store"):
    from memory.store import VectorStore
    store = VectorStore(spec["store"], create=False)
    return CollectionRetriever(store.get_collection(spec.get("collection", "default"), embedder))
  from retrieval.documents import read_jsonl
  from retrieval.engine import create_search_engine
  reranker = None
  if spec.get("reranker"):
    from retrieval.rerank import CrossEncoderReranker
    reranker = CrossEncoderReranker.from_pretrained(spec["reranker"])
  return create_search_engine(spec["kind"], read_jsonl(spec["corpus"]),
                              embedder=embedder or spec.get("embedder", "all-MiniLM-L6-v2"), reranker=reranker,
                              rerank_pool=spec.get("rerank_pool", 20), fusion=spec.get("fusion", "rrf"))
