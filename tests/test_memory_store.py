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


def brute_force(q, embs, allowed, k, space="l2"):
  """Reference distances computed directly (not through memory.index)."""
  if space == "l2":
    d = ((embs - q) ** 2).sum(1)
  elif space == "ip":
    d = 1 - embs @ q
  else:
    d = 1 - (embs / np.linalg.norm(embs, axis=1, keepdims=True)) @ (q / np.linalg.norm(q))
  order = [i for i in np.argsort(d, kind="stable") if allowed[i]]
  return [f"r{i}" for i in order[:k]], [d[i] for i in order[:k]]


def test_query_matches_brute_force_with_and_without_filter(filled):
  col, (ids, _, embs, metas) = filled
  q = np.random.default_rng(1).normal(size=16).astype(np.float32)
  res = col.query(query_embeddings=[q], n_results=7)
  want_ids, want_d = brute_force(q, embs, [True] * len(ids), 7)
  assert res["ids"][0] == want_ids
  np.testing.assert_allclose(res["distances"][0], want_d, rtol=1e-5, atol=1e-4)
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


def test_crud_and_errors(tmp_path, caplog):
  emb = HashingEmbedding(32)
  col = VectorStore(tmp_path).get_or_create_collection("c", emb, metadata={"hnsw:space": "cosine"})
  col.add(["a", "b"], documents=["the cat sat", "dogs bark"], metadatas=[{"k": 1}, {"k": 2}])
  col.add(["a"], documents=["x"])  # Chroma: an existing id keeps its record, with a warning
  assert col.get(["a"])["documents"] == ["the cat sat"] and "already present" in caplog.text
  col.update(["zz"], documents=["x"])  # Chroma: a missing id is skipped, with a warning
  assert col.count() == 2 and "missing id" in caplog.text
  with pytest.raises(ValueError, match="2 documents for 1 ids"):
    col.upsert(["q"], documents=["x", "y"])
  with pytest.raises(ValueError, match=r"metadatas\[0\]\['bad'\]\[1\]"):
    col.upsert(["q"], documents=["x"], metadatas=[{"bad": [1, {}]}])
  with pytest.raises(ValueError, match=r"metadatas\[0\]\['bad'\]: list \[1, 'a'\] mixes types"):
    col.upsert(["q"], documents=["x"], metadatas=[{"bad": [1, "a"]}])
  with pytest.raises(ValueError, match=r"invalid regular expression '\('"):
    col.get(where_document={"$regex": "("})
  col.update(["a"], metadatas=[{"k": None, "new": "v"}])
  assert col.get(["a"])["metadatas"] == [{"new": "v"}]
  before = col.get(["b"], include=("embeddings",))["embeddings"]
  col.update(["b"], documents=["cats purr"])  # a new document is re-embedded
  after = col.get(["b"], include=("embeddings", "documents"))
  assert after["documents"] == ["cats purr"] and not np.allclose(before, after["embeddings"])
  col.upsert(["b", "c"], documents=["cats meow", "birds sing"])
  assert col.count() == 3 and col.get(["b"])["metadatas"] == [{"k": 2}]  # upsert merges metadata
  assert col.query(query_texts=["birds"], n_results=1)["ids"] == [["c"]]
  assert col.delete(where={"new": "v"}) == 1 and col.count() == 2
  assert col.query(query_texts="cat", n_results=5)["ids"][0][0] in ("b", "c") and len(col.index()) == 2
  with pytest.raises(ValueError, match="embeddings of shape"):
    col.add(["z"], embeddings=np.ones((1, 5)))
  with pytest.raises(ValueError, match="hnsw:space='dot'"):
    VectorStore(tmp_path).get_or_create_collection("d", emb, metadata={"hnsw:space": "dot"})


def test_embeddings_are_returned_as_stored_and_spaces_are_per_collection(tmp_path):
  ids, _, embs, _ = records(200, dim=8, seed=4)
  embs *= np.random.default_rng(0).uniform(0.1, 5, size=(200, 1)).astype(np.float32)  # varied norms
  q = np.random.default_rng(1).normal(size=8).astype(np.float32)
  store = VectorStore(tmp_path)
  for space in ("l2", "cosine", "ip"):
    col = store.get_or_create_collection(f"c-{space}", lambda t: None, metadata={"hnsw:space": space})
    col.add(ids, embeddings=embs)
    np.testing.assert_array_equal(col.get(include=("embeddings",))["embeddings"], embs)
    res = col.query(query_embeddings=[q], n_results=6, include=("distances", "embeddings"))
    want_ids, want_d = brute_force(q, embs, [True] * 200, 6, space)
    assert res["ids"][0] == want_ids, space
    np.testing.assert_allclose(res["distances"][0], want_d, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(res["embeddings"][0], embs[[int(i[1:]) for i in want_ids]])
    sub = ids[::7]
    res = col.query(query_embeddings=[q], n_results=3, ids=sub, include=())
    assert res["ids"][0] == brute_force(q, embs, [i % 7 == 0 for i in range(200)], 3, space)[0]


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
    from memory.store import VectorStore
    path, B = sys.argv[1], int(sys.argv[2])
    col = VectorStore(path).get_or_create_collection("k", lambda t: None)
    for b in range(100000):
      ids = [f"{b}-{i}" for i in range(B)]
      vecs = np.random.default_rng(b).normal(size=(B, 16)).astype(np.float32)
      col.upsert(ids, embeddings=vecs, documents=[f"batch {b} item {i}" for i in range(B)],
                 metadatas=[{"batch": b, "i": i} for i in range(B)])
      if b % 5 == 4:
        col.delete(ids=[f"{b - 1}-0"])
      print("ack", b, flush=True)
    """


@pytest.mark.parametrize("B,acks", [(1, 40), (3000, 3)])
def test_sigkill_mid_stream_keeps_every_acknowledged_write(tmp_path, B, acks):
  """Kill -9 a writer at a random moment: every write it acknowledged is there, exactly, and nothing else
  but possibly the one in flight; the database passes SQLite's integrity check; the index agrees."""
  import sqlite3
  import time
  child = run_child(WRITER, str(tmp_path), str(B))
  acked = -1
  for line in child.stdout:
    acked = int(line.split()[1])
    if acked + 1 >= acks:
      break
  time.sleep(0.3 * np.random.default_rng().random())
  child.send_signal(signal.SIGKILL)
  child.wait()
  for line in child.stdout.read().splitlines():  # acknowledged before the kill landed
    acked = int(line.split()[1])
  db = sqlite3.connect(tmp_path / "store.sqlite3")
  assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
  db.close()
  col = VectorStore(tmp_path).get_collection("k", lambda t: None)
  deleted = {f"{b - 1}-0" for b in range(acked + 1) if b % 5 == 4}
  acked_ids = {f"{b}-{i}" for b in range(acked + 1) for i in range(B)} - deleted
  in_flight = {f"{acked + 1}-{i}" for i in range(B)}
  got = col.get(include=("embeddings", "metadatas"))
  if (acked + 1) % 5 == 4 and set(got["ids"]) >= in_flight:
    acked_ids.discard(f"{acked}-0")  # the in-flight iteration's delete may have committed
  assert acked_ids <= set(got["ids"]) <= acked_ids | in_flight | {f"{acked}-0"}
  want = {b: np.random.default_rng(b).normal(size=(B, 16)).astype(np.float32) for b in range(acked + 2)}
  for vec, meta in zip(got["embeddings"], got["metadatas"]):
    np.testing.assert_array_equal(vec, want[meta["batch"]][meta["i"]])
  assert len(col.index()) == col.count()
  last = got["ids"][-1]
  assert col.query(query_embeddings=got["embeddings"][-1:], n_results=1, include=())["ids"][0][0] == last


def test_index_catches_up_with_other_processes_writes(tmp_path, monkeypatch):
  """A reader's in-memory index follows another process's upserts and deletes (log replay), also after
  the change log was trimmed past the reader's version (rebuild)."""
  ids, _, embs, _ = records(500, dim=16)
  col = VectorStore(tmp_path).get_or_create_collection("k", lambda t: None)
  col.add(ids, embeddings=embs)
  q = embs[:3] + 0.01
  assert col.query(query_embeddings=q, n_results=1, include=())["ids"] == [["r0"], ["r1"], ["r2"]]
  for trim in (False, True):
    child = run_child("""
        import sys, numpy as np, memory.store
        from memory.store import VectorStore
        if sys.argv[2] == "True":
          memory.store.CHANGE_LOG_VERSIONS = 2
        col = VectorStore(sys.argv[1]).get_collection("k", lambda t: None)
        q = np.array(eval(sys.argv[3]), np.float32)
        col.delete(ids=["r0"])
        for i in range(5):
          col.upsert([f"n{i}"], embeddings=q[1:2] + 0.001 * (i + 1))
        col.upsert(["r2"], embeddings=-q[2:3])
        """, str(tmp_path), str(trim), repr(q.tolist()))
    child.communicate(timeout=60)
    assert child.returncode == 0
    res = col.query(query_embeddings=q, n_results=2, include=())["ids"]
    assert res[0][0] != "r0" and res[1][0] in {f"n{i}" for i in range(5)} and "r2" not in res[2]
    assert len(col.index()) == col.count() == 504
    col.add(["r0"], embeddings=embs[:1])
    col.update(["r2"], embeddings=embs[2:3])
    for name in [f"n{i}" for i in range(5)]:
      col.delete(ids=[name])


def _written_bytes() -> int:
  with open("/proc/self/io") as f:
    return int(next(line for line in f if line.startswith("wchar:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
def test_one_record_write_cost_does_not_grow_with_the_store(tmp_path):
  """Bytes written by a one-record upsert stay small as the store grows (the old store re-saved its whole
  FAISS index on every write: 20000 x 64 floats = 5 MB)."""
  col = VectorStore(tmp_path).get_or_create_collection("k", lambda t: None)
  rng = np.random.default_rng(0)
  cost = {}
  for n in (2000, 20000):
    have = col.count()
    col.add([f"r{i}" for i in range(have, n)], embeddings=rng.normal(size=(n - have, 64)).astype(np.float32))
    col.query(query_embeddings=rng.normal(size=(1, 64)), n_results=1)
    before = _written_bytes()
    for j in range(5):
      col.upsert([f"r{j}"], embeddings=rng.normal(size=(1, 64)).astype(np.float32), metadatas=[{"j": j}])
    cost[n] = (_written_bytes() - before) / 5
  assert cost[20000] < 64_000 and cost[20000] < 2 * cost[2000] + 16_000, cost


def clustered(n: int, dim: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(50, dim)).astype(np.float32)
  return (centers[rng.integers(0, 50, n)] + 0.3 * rng.normal(size=(n, dim))).astype(np.float32)


def test_ivf_index_recall_persistence_and_updates(tmp_path):
  x = clustered(4000, 16)
  meta = {"hnsw:space": "cosine", "index:ivf_threshold": 3000, "index:nprobe": 8}
  col = VectorStore(tmp_path).get_or_create_collection("v", lambda t: None, metadata=meta)
  ids = [f"r{i}" for i in range(4000)]
  col.add(ids[:2000], embeddings=x[:2000])
  assert col.index().structure == "flat"
  col.add(ids[2000:], embeddings=x[2000:])
  assert col.index().structure == "ivf"
  col.delete(ids=ids[:100])
  col.upsert(ids[100:200], embeddings=-x[100:200])
  q = clustered(50, 16, seed=1)
  reopened = VectorStore(tmp_path).get_collection("v", lambda t: None)
  stored = reopened.get(include=("embeddings",))
  assert reopened.index().structure == "ivf" and len(reopened.index()) == 3900
  np.testing.assert_array_equal(reopened.index().centroids, col.index().centroids)  # persisted, not retrained
  ref = 1 - (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (
      stored["embeddings"] / np.linalg.norm(stored["embeddings"], axis=1, keepdims=True)).T
  got = reopened.query(query_embeddings=q, n_results=10, include=())["ids"]
  recall = np.mean([len(set(g) & {stored["ids"][j] for j in np.argsort(r)[:10]}) / 10 for g, r in zip(got, ref)])
  assert recall >= 0.9 and not {i for g in got for i in g} & set(ids[:100])


def test_flat_index_random_operations_match_a_dict_model(tmp_path):
  """Random add / upsert / update / delete sequences: the index's answers equal brute force over a dict."""
  from memory.index import VectorIndex
  rng = np.random.default_rng(11)
  index, model = VectorIndex(8, "ip", "flat"), {}
  for step in range(300):
    ids = [f"k{j}" for j in rng.integers(0, 60, rng.integers(1, 5))]
    ids = list(dict.fromkeys(ids))
    if rng.random() < 0.3:
      index.delete(ids)
      for s in ids:
        model.pop(s, None)
    else:
      v = rng.normal(size=(len(ids), 8)).astype(np.float32)
      index.upsert(ids, v)
      model.update(zip(ids, v))
    q = rng.normal(size=8).astype(np.float32)
    names = list(model)
    if names:
      d = 1 - np.stack([model[s] for s in names]) @ q
      want = [names[j] for j in np.argsort(d, kind="stable")[:5]]
      assert [h[0] for h in index.search(q, 5)[0]] == want, step
    assert len(index) == len(model)
