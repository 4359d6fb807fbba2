"""Search engines and the Search-R1 HTTP server (real urllib client on an ephemeral 127.0.0.1 port)."""
import concurrent.futures
import hashlib
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from retrieval import fusion
from retrieval.engine import create_search_engine
from retrieval.server import RetrievalServer, retrieve_http

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


@pytest.fixture(scope="module")
def server(hybrid):
  srv = RetrievalServer(hybrid, host="127.0.0.1", port=0, max_workers=4)
  thread = threading.Thread(target=srv.serve_forever, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{srv.server_port}"
  srv.shutdown()
  srv.server_close()


def _post(url, body: bytes):
  request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=10) as r:
      return r.status, json.loads(r.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


def test_server_search_r1_schema(server, hybrid):
  result = retrieve_http(server + "/retrieve", ["protein folding", "glucose"], topk=2)
  assert len(result) == 2 and len(result[0]) == 2
  expected = hybrid.search("protein folding", 2)
  assert [r["document"]["id"] for r in result[0]] == [h.id for h in expected]
  top = next(h for h in expected if h.id == result[0][0]["document"]["id"])
  assert result[0][0]["document"]["contents"] == f'"{top.title}"\n{top.text}'
  assert result[0][0]["score"] == pytest.approx(top.score)
  status, body = _post(server + "/retrieve", json.dumps({"queries": ["ATP"], "topk": 1}).encode())
  assert status == 200 and set(body["result"][0][0]) == {"id", "contents"}  # return_scores false


def test_server_edge_cases(server):
  status, body = _post(server + "/retrieve", b'{"queries": ["x"')
  assert status == 400 and "malformed JSON" in body["error"]
  status, body = _post(server + "/retrieve", json.dumps({"queries": "x"}).encode())
  assert status == 400 and "'queries'" in body["error"]
  status, body = _post(server + "/retrieve", json.dumps({"queries": ["x"], "topk": 0}).encode())
  assert status == 400 and "'topk'" in body["error"]
  assert _post(server + "/nope", b"{}")[0] == 404
  assert retrieve_http(server + "/retrieve", [], topk=3) == []
  huge = retrieve_http(server + "/retrieve", ["cells"], topk=10**9)
  assert len(huge[0]) == len(DOCS)


def test_server_concurrent_requests(server, hybrid):
  queries = [f"{w} cells" for w in ("immune", "protein", "glucose", "amyloid", "gut", "ATP")] * 4
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    results = list(pool.map(lambda q: retrieve_http(server + "/retrieve", [q], topk=3), queries))
  for q, r in zip(queries, results):
    assert [x["document"]["id"] for x in r[0]] == [h.id for h in hybrid.search(q, 3)]
