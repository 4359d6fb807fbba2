"""VectorStore / Collection: CRUD, every filter operator against a Python reference, queries against
NumPy brute force, reranking, persistence across processes and SIGKILL during writes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from memory.hashing import HashingEmbedding
from memory.store import VectorStore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLORS = ["red", "green", "blue"]


def records(n: int, dim: int = 16, seed: int = 0):
  rng = np.random.default_rng(seed)
  ids = [f"r{i}" for i in range(n)]
  docs = [f"doc {i} about {COLORS[i % 3]} things" + (" special" if i % 7 == 0 else "") for i in range(n)]
  metas = []
  for i in range(n):
    m = {"year": int(rng.integers(2000, 2010)), "score": float(rng.random()), "color": COLORS[i % 3]}
    if i % 5 == 0:
      m["flag"] = bool(i % 2)
    metas.append(m)
  return ids, docs, rng.normal(size=(n, dim)).astype(np.float32), metas


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
  ids, docs, embs, metas = records(300)
  col = VectorStore(tmp_path_factory.mktemp("s")).get_or_create_collection("c", HashingEmbedding(16))
  col.add(ids, documents=docs, embeddings=embs, metadatas=metas)
  return col, (ids, docs, embs, metas)


FILTERS = [  # (where, Python predicate over metadata)
    ({"color": "red"}, lambda m: m["color"] == "red"),
    ({"year": {"$eq": 2003}}, lambda m: m["year"] == 2003),
    ({"color": {"$ne": "blue"}}, lambda m: m["color"] != "blue"),
    ({"flag": {"$ne": True}}, lambda m: m.get("flag") is not True),
    ({"year": {"$gt": 2005}}, lambda m: m["year"] > 2005),
    ({"year": {"$gte": 2005}}, lambda m: m["year"] >= 2005),
    ({"score": {"$lt": 0.25}}, lambda m: m["score"] < 0.25),
    ({"score": {"$lte": 0.5}}, lambda m: m["score"] <= 0.5),
    ({"color": {"$in": ["red", "blue"]}}, lambda m: m["color"] in ("red", "blue")),
    ({"year": {"$nin": [2001, 2002]}}, lambda m: m["year"] not in (2001, 2002)),
    ({"$and": [{"color": "green"}, {"year": {"$lt": 2004}}]}, lambda m: m["color"] == "green" and m["year"] < 2004),
    ({"$or": [{"flag": False}, {"score": {"$gt": 0.9}}]}, lambda m: m.get("flag") is False or m["score"] > 0.9),
    ({"flag": 1}, lambda m: False),  # 1 is not True: values are typed
]


@pytest.mark.parametrize("where,pred", FILTERS, ids=[json.dumps(f[0]) for f in FILTERS])
def test_where_operators_match_python_reference(filled, where, pred):
  col, (ids, _, _, metas) = filled
  assert col.get(where=where, include=())["ids"] == [i for i, m in zip(ids, metas) if pred(m)]


def test_where_document_and_combined(filled):
  col, (ids, docs, _, metas) = filled
  got = col.get(where_document={"$contains": "special"}, include=())["ids"]
  assert got == [i for i, d in zip(ids, docs) if "special" in d]
  got = col.get(where={"color": "red"}, where_document={"$not_contains": "special"}, include=())["ids"]
  assert got == [i for i, d, m in zip(ids, docs, metas) if "special" not in d and m["color"] == "red"]
  got = col.get(where_document={"$or": [{"$contains": "doc 1 "}, {"$contains": "doc 2 "}]}, include=())["ids"]
  assert got == ["r1", "r2"]


@pytest.mark.parametrize("where,message", [
    ({"year": {"$gt": "x"}}, r"where\['year'\]\['\$gt'\]: expected a number"),
    ({"year": {"$foo": 1}}, r"unknown operator '\$foo'"),
    ({"$and": []}, r"non-empty list"),
    ({"color": {"$in": "red"}}, r"non-empty list"),
    ({"color": [1, 2]}, r"expected str, int, float or bool"),
])
def test_bad_filters_name_the_field(filled, where, message):
  with pytest.raises(ValueError, match=message):
    filled[0].get(where=where)


def brute_force(q, embs, allowed, k):
  e = embs / np.linalg.norm(embs, axis=1, keepdims=True)
  s = e @ (q / np.linalg.norm(q))
  order = [i for i in np.argsort(-s, kind="stable") if allowed[i]]
  return [f"r{i}" for i in order[:k]], [1.0 - s[i] for i in order[:k]]


def test_query_matches_brute_force_with_and_without_filter(filled):
  col, (ids, _, embs, metas) = filled
  q = np.random.default_rng(1).normal(size=16).astype(np.float32)
  res = col.query(query_embeddings=[q], n_results=7)
  want_ids, want_d = brute_force(q, embs, [True] * len(ids), 7)
  assert res["ids"][0] == want_ids
  np.testing.assert_allclose(res["distances"][0], want_d, atol=1e-5)
  res = col.query(query_embeddings=[q], n_results=5, where={"color": "blue"}, include=("metadatas",))
  assert res["ids"][0] == brute_force(q, embs, [m["color"] == "blue" for m in metas], 5)[0]
  assert all(m["color"] == "blue" for m in res["metadatas"][0])


def test_broad_filter_uses_post_filtering_and_stays_exact(tmp_path):
  ids, docs, embs, metas = records(12000, dim=8, seed=3)
  col = VectorStore(tmp_path).get_or_create_collection("big", HashingEmbedding(8))
  col.add(ids, embeddings=embs, metadatas=metas)
  q = np.random.default_rng(2).normal(size=(2, 8)).astype(np.float32)
  where = {"color": {"$ne": "red"}}  # 2/3 pass: more than max(4096, n/4), the FAISS post-filter path
  res = col.query(query_embeddings=q, n_results=10, where=where, include=())
  for qi in range(2):
    assert res["ids"][qi] == brute_force(q[qi], embs, [m["color"] != "red" for m in metas], 10)[0]


def test_crud_and_errors(tmp_path):
  emb = HashingEmbedding(32)
  col = VectorStore(tmp_path).get_or_create_collection("c", emb)
  col.add(["a", "b"], documents=["the cat sat", "dogs bark"], metadatas=[{"k": 1}, {"k": 2}])
  with pytest.raises(ValueError, match="'a' already exists"):
    col.add(["a"], documents=["x"])
  with pytest.raises(KeyError, match="'zz' not in collection"):
    col.update(["zz"], documents=["x"])
  with pytest.raises(ValueError, match="2 documents for 1 ids"):
    col.upsert(["q"], documents=["x", "y"])
  with pytest.raises(ValueError, match=r"metadatas\[0\]\['bad'\]"):
    col.upsert(["q"], documents=["x"], metadatas=[{"bad": [1]}])
  col.update(["a"], metadatas=[{"k": None, "new": "v"}])
  assert col.get(["a"])["metadatas"] == [{"new": "v"}]
  before = col.get(["b"], include=("embeddings",))["embeddings"]
  col.update(["b"], documents=["cats purr"])  # a new document is re-embedded
  after = col.get(["b"], include=("embeddings", "documents"))
  assert after["documents"] == ["cats purr"] and not np.allclose(before, after["embeddings"])
  col.upsert(["b", "c"], documents=["cats meow", "birds sing"])
  assert col.count() == 3 and col.get(["b"])["metadatas"] == [{}]
  assert col.query(query_texts=["birds"], n_results=1)["ids"] == [["c"]]
  assert col.delete(where={"new": "v"}) == 1 and col.count() == 2
  assert col.query(query_texts="cat", n_results=5)["ids"][0][0] in ("b", "c") and len(col.index()) == 2
  with pytest.raises(ValueError, match="embeddings of shape"):
    col.add(["z"], embeddings=np.ones((1, 5)))


def test_rerank_reorders_candidates(tmp_path):
  col = VectorStore(tmp_path).get_or_create_collection("c", HashingEmbedding(32))
  docs = ["alpha beta", "alpha beta gamma delta", "alpha", "beta gamma", "zeta"]
  col.add([f"d{i}" for i in range(5)], documents=docs)

  class LongestFirst:  # a stand-in cross-encoder: prefers longer documents
    def score(self, query, texts):
      return np.array([len(t) for t in texts], np.float32)
  col.reranker = LongestFirst()
  plain = col.query(query_texts=["alpha"], n_results=2)
  res = col.query(query_texts=["alpha"], n_results=2, rerank=True)
  pool = col.query(query_texts=["alpha"], n_results=6)["documents"][0]
  assert res["documents"][0] == sorted(pool, key=len, reverse=True)[:2]
  assert res["rerank_scores"][0] == [float(len(d)) for d in res["documents"][0]]
  assert len(plain["ids"][0]) == 2


def run_child(code: str, *args, **kw):
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE,
                          text=True, env=env, **kw)


def test_store_survives_a_new_process(filled):
  col, (_, _, embs, _) = filled
  q = embs[5] + 0.1
  want = col.query(query_embeddings=[q], n_results=4, where={"year": {"$gte": 2003}}, include=("distances",))
  child = run_child("""
      import json, sys, numpy as np
      from memory.store import VectorStore
      from memory.hashing import HashingEmbedding
      col = VectorStore(sys.argv[1]).get_collection("c", HashingEmbedding(16))
      q = np.array(json.loads(sys.argv[2]), np.float32)
      res = col.query(query_embeddings=[q], n_results=4, where={"year": {"$gte": 2003}}, include=("distances",))
      print(json.dumps([col.count(), res["ids"], res["distances"]]))
      """, str(col.store.path), json.dumps(q.tolist()))
  out, _ = child.communicate(timeout=60)
  count, ids, dists = json.loads(out)
  assert count == col.count() and ids == want["ids"]
  np.testing.assert_allclose(dists, want["distances"], atol=1e-6)


WRITER = """
    import sys, numpy as np
    import memory.store
    from memory.store import VectorStore
    from memory.hashing import HashingEmbedding
    path, mode = sys.argv[1], sys.argv[2]
    col = VectorStore(path).get_or_create_collection("k", HashingEmbedding(16))
    if mode == "hang_after_commit":  # SQLite committed, FAISS index never saved
      def hang(*a, **k):
        print("committed", flush=True)
        import time; time.sleep(600)
      col.store.save_index = hang
    B = int(sys.argv[3])
    for b in range(1000):
      ids = [f"{b}-{i}" for i in range(B)]
      vecs = np.random.default_rng(b).normal(size=(B, 16)).astype(np.float32)
      print("start", b, flush=True)
      col.upsert(ids, embeddings=vecs, documents=[f"batch {b} item {i}" for i in range(B)],
                 metadatas=[{"batch": b, "i": i} for i in range(B)])
      print("done", b, flush=True)
    """


def check_state(path, batches: int, B: int):
  col = VectorStore(path).get_collection("k", HashingEmbedding(16))
  assert col.count() == batches * B and len(col.index()) == batches * B
  got = col.get(where={"batch": batches - 1}, include=("embeddings", "documents"))
  want = np.random.default_rng(batches - 1).normal(size=(B, 16)).astype(np.float32)
  np.testing.assert_allclose(got["embeddings"], want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-6)
  hit = col.query(query_embeddings=want[:1], n_results=1, include=())["ids"][0][0]
  assert hit == f"{batches - 1}-0"


def test_kill_between_sqlite_commit_and_index_save_rebuilds_index(tmp_path):
  child = run_child(WRITER, str(tmp_path), "hang_after_commit", "50")
  for line in child.stdout:
    if line.startswith("committed"):
      break
  child.send_signal(signal.SIGKILL)
  child.wait()
  check_state(tmp_path, 1, 50)  # index on disk is missing/stale: rebuilt from SQLite


def test_sigkill_mid_upsert_keeps_last_committed_state(tmp_path):
  B = 4000
  child = run_child(WRITER, str(tmp_path), "normal", str(B))
  done = -1
  for line in child.stdout:
    if line.startswith("done"):
      done = int(line.split()[1])
    if line.startswith("start") and int(line.split()[1]) == 2:
      break
  import time
  time.sleep(0.05 + 0.3 * np.random.default_rng().random())  # somewhere inside batch 2's upsert
  child.send_signal(signal.SIGKILL)
  child.wait()
  col = VectorStore(tmp_path).get_collection("k", HashingEmbedding(16))
  batches = col.count() // B
  # the child may have committed more batches while this process slept; what matters is that the
  # store holds whole committed batches only, each exactly as written
  assert col.count() % B == 0 and batches >= done + 1
  check_state(tmp_path, batches, B)
