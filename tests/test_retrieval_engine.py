"""Search engines: vector, BM25, hybrid (RRF), reranking, bad documents (the server: test_retrieval_server.py)."""
import hashlib

import numpy as np
import pytest

from retrieval import fusion
from retrieval.engine import create_search_engine

DOCS = [
    {"id": "p1", "title": "Protein folding", "text": "Hydrophobic collapse drives protein folding in water."},
    {"id": "p2", "title": "Mitochondria", "text": "Mitochondria make ATP by oxidative phosphorylation."},
    {"id": "p3", "title": "Alzheimer", "text": "Amyloid fibrils build up in Alzheimer brains.", "metadata": {"y": 1}},
    {"id": "p4", "title": "Immunity", "text": "T cells and B cells drive adaptive immunity."},
    {"id": "p5", "title": "Diabetes", "text": "Insulin resistance impairs glucose uptake."},
    "The gut microbiome shapes the immune system.",
]


class HashEmbedder:
  """Deterministic bag-of-words embedder (hashed unigrams), L2-normalised: a fast stand-in for MiniLM."""
  dim = 64

  def encode(self, texts, batch_size=64, show_progress=None):
    out = np.zeros((len(texts), self.dim), np.float32)
    for i, t in enumerate(texts):
      for w in t.lower().split():
        out[i, int(hashlib.md5(w.strip(".,?").encode()).hexdigest(), 16) % self.dim] += 1
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


class LengthReranker:
  """Prefers shorter texts: a reranker whose order differs visibly from the retrievers'."""

  def rerank(self, query, hits, top_n=None):
    import dataclasses
    scored = sorted(hits, key=lambda h: len(h.text))[:top_n]
    return [dataclasses.replace(h, score=-float(len(h.text))) for h in scored]


@pytest.fixture(scope="module")
def hybrid():
  return create_search_engine("hybrid", DOCS, embedder=HashEmbedder(), bm25={"stemmer": "english"})


def test_engines_return_hits(hybrid):
  bm25 = create_search_engine("bm25", DOCS)
  vector = create_search_engine("vector", DOCS, embedder=HashEmbedder())
  hits = bm25.search("protein folding", 3)
  assert hits[0].id == "p1" and hits[0].title == "Protein folding"
  assert vector.search("amyloid fibrils alzheimer", 1)[0].id == "p3"
  assert vector.search("amyloid fibrils alzheimer", 1)[0].metadata == {"y": 1}
  assert bm25.search("gut microbiome", 1)[0].id == "5"  # plain strings get their position as id
  assert len(vector.search("anything", 1000)) == len(DOCS)  # k capped at corpus size
  assert [len(r) for r in hybrid.search_batch(["cells", "glucose", "ATP"], 2)] == [2, 2, 2]


def test_hybrid_is_rrf_of_its_parts(hybrid):
  query = "immune cells"
  dense = [(h.id, h.score) for h in hybrid.vector.search(query, 6)]
  lexical = [(h.id, h.score) for h in hybrid.bm25.search(query, 6)]
  expected = fusion.rrf([dense, lexical], k=60)[:3]
  got = [(h.id, h.score) for h in hybrid.search(query, 3)]
  assert [d for d, _ in got] == [d for d, _ in expected]
  np.testing.assert_allclose([s for _, s in got], [s for _, s in expected])


def test_reranker_reorders_pool():
  engine = create_search_engine("bm25", DOCS, reranker=LengthReranker(), rerank_pool=10)
  pool = engine.bm25.search(["cells immune system"], 10)[0]
  hits = engine.search("cells immune system", 1)
  shortest = min((engine.documents[d] for d, _ in pool), key=lambda d: len(d.text))
  assert hits[0].id == shortest.id


def test_bad_documents_are_named():
  with pytest.raises(ValueError, match=r"documents\[1\]: no 'text'"):
    create_search_engine("bm25", [{"id": "a", "text": "x"}, {"id": "b"}])
  with pytest.raises(ValueError, match="duplicate id 'a'"):
    create_search_engine("bm25", [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
  with pytest.raises(ValueError, match="kind='sparse'"):
    create_search_engine("sparse", [])
