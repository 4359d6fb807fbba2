"""Parity with chromadb 1.5.9 (the reference implementation) given the same explicit embeddings: write
semantics (add / update / upsert merging), returned embeddings, distances in each space, and several dozen
where / where_document filters, on get and on query."""
from __future__ import annotations

import itertools
import json
import logging

import numpy as np
import pytest

from memory.store import VectorStore

pytestmark = pytest.mark.fast

chromadb = pytest.importorskip("chromadb")

COLORS = ["red", "green", "blue"]
TAGS = ["a", "b", "c", "d"]


def dataset(n: int = 120, dim: int = 8):
  rng = np.random.default_rng(7)
  ids = [f"r{i}" for i in range(n)]
  docs = [None if i % 11 == 0 else f"Doc {i}: {COLORS[i % 3]} item" + (" SPECIAL x12" if i % 7 == 0 else "")
          for i in range(n)]
  metas = []
  for i in range(n):
    m = {"year": int(rng.integers(2000, 2010)), "score": float(rng.random()), "color": COLORS[i % 3]}
    if i % 5 == 0:
      m["flag"] = bool(i % 2)
    if i % 4 != 3:
      m["tags"] = [t for j, t in enumerate(TAGS) if (i >> j) & 1] or ["none"]
      m["nums"] = [i % 3, i % 5 + 10]
    metas.append(m)
  return ids, docs, rng.normal(size=(n, dim)).astype(np.float32), metas


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  ids, docs, embs, metas = dataset()
  client = chromadb.EphemeralClient()
  ref = client.create_collection("parity", metadata={"hnsw:space": "l2"})
  ref.add(ids=ids, embeddings=embs, documents=docs, metadatas=metas)
  ours = VectorStore(tmp_path_factory.mktemp("s")).get_or_create_collection("parity", lambda t: None)
  ours.add(ids, embeddings=embs, documents=docs, metadatas=metas)
  return ref, ours, client


WHERE = [
    {"color": "red"}, {"color": {"$eq": "blue"}}, {"color": {"$ne": "blue"}}, {"year": 2003},
    {"year": {"$gt": 2005}}, {"year": {"$gte": 2005}}, {"score": {"$lt": 0.25}}, {"score": {"$lte": 0.5}},
    {"color": {"$in": ["red", "blue"]}}, {"year": {"$nin": [2001, 2002]}}, {"flag": True}, {"flag": False},
    {"flag": {"$ne": True}}, {"flag": 1}, {"year": {"$in": [2003, 2004]}},
    {"tags": {"$contains": "a"}}, {"tags": {"$not_contains": "a"}}, {"tags": {"$contains": "none"}},
    {"nums": {"$contains": 12}}, {"nums": {"$not_contains": 0}}, {"tags": "a"}, {"tags": {"$ne": "a"}},
    {"tags": {"$in": ["a"]}}, {"tags": {"$nin": ["a"]}}, {"color": {"$contains": "red"}},
    {"color": {"$not_contains": "red"}}, {"nums": {"$gt": 5}},
    {"$and": [{"color": "green"}, {"year": {"$lt": 2004}}]},
    {"$or": [{"flag": False}, {"score": {"$gt": 0.9}}]},
    {"$and": [{"tags": {"$contains": "b"}}, {"$or": [{"color": "red"}, {"nums": {"$contains": 0}}]}]},
]
WHERE_DOCUMENT = [
    {"$contains": "SPECIAL"}, {"$not_contains": "SPECIAL"}, {"$contains": "special"}, {"$regex": r"Doc \d+5:"},
    {"$not_regex": "^Doc 1"}, {"$regex": "(?i)special"}, {"$regex": r"x1[0-9]$"},
    {"$or": [{"$contains": "red"}, {"$regex": "blue item$"}]}, {"$and": [{"$contains": "item"}, {"$not_contains": "green"}]},
]


@pytest.mark.parametrize("where", WHERE, ids=[json.dumps(w) for w in WHERE])
def test_get_where_matches_chroma(pair, where):
  ref, ours, _ = pair
  assert sorted(ours.get(where=where, include=())["ids"]) == sorted(ref.get(where=where, include=[])["ids"])


@pytest.mark.parametrize("where_document", WHERE_DOCUMENT, ids=[json.dumps(w) for w in WHERE_DOCUMENT])
def test_get_where_document_matches_chroma(pair, where_document):
  ref, ours, _ = pair
  got = ours.get(where_document=where_document, include=())["ids"]
  assert sorted(got) == sorted(ref.get(where_document=where_document, include=[])["ids"])
  both = {"color": {"$ne": "red"}}
  assert sorted(ours.get(where=both, where_document=where_document, include=())["ids"]) == \
      sorted(ref.get(where=both, where_document=where_document, include=[])["ids"])


def rounded(metas):  # Chroma's float metadata round-trip can change the last bit
  return [{k: round(v, 12) if isinstance(v, float) else v for k, v in m.items()} for m in metas]


def test_get_returns_what_chroma_returns(pair):
  ref, ours, _ = pair
  a = ours.get(include=("documents", "metadatas", "embeddings"))
  b = ref.get(include=["documents", "metadatas", "embeddings"])
  assert a["ids"] == b["ids"] and a["documents"] == b["documents"]
  assert rounded(a["metadatas"]) == rounded(b["metadatas"])
  np.testing.assert_array_equal(a["embeddings"], np.asarray(b["embeddings"], np.float32))  # not normalised


@pytest.mark.parametrize("space", ["l2", "cosine", "ip"])
def test_query_distances_match_chroma_in_each_space(tmp_path, space):
  ids, docs, embs, metas = dataset(80)
  ref = chromadb.EphemeralClient().create_collection(f"sp-{space}", metadata={"hnsw:space": space})
  ref.add(ids=ids, embeddings=embs, documents=docs, metadatas=metas)
  ours = VectorStore(tmp_path).get_or_create_collection("c", lambda t: None, metadata={"hnsw:space": space})
  ours.add(ids, embeddings=embs, documents=docs, metadatas=metas)
  q = np.random.default_rng(3).normal(size=(3, 8)).astype(np.float32) * 2
  for where, q_ids in [(None, None), ({"color": "red"}, None), ({"tags": {"$contains": "b"}}, None),
                       (None, ids[::3]), ({"year": {"$gt": 2004}}, ids[:50])]:
    kw = {k: v for k, v in (("where", where), ("ids", q_ids)) if v is not None}
    a = ours.query(query_embeddings=q, n_results=5, include=("distances",), **kw)
    b = ref.query(query_embeddings=q, n_results=5, include=["distances"], **kw)
    assert a["ids"] == b["ids"], (space, where)
    np.testing.assert_allclose(a["distances"], b["distances"], rtol=1e-4, atol=1e-4)


def test_write_semantics_match_chroma(tmp_path, caplog):
  """The same sequence of add / update / upsert calls leaves both stores in the same state."""
  ref = chromadb.EphemeralClient().create_collection("writes")
  ours = VectorStore(tmp_path).get_or_create_collection("writes", lambda t: None)
  e = lambda *rows: np.asarray(rows, np.float32)  # noqa: E731
  steps = [
      ("add", dict(ids=["x", "y"], embeddings=e([3, 4, 0], [1, 0, 0]), documents=["hello", "world"],
                   metadatas=[{"x": 1, "y": 2}, {"k": "v"}])),
      ("upsert", dict(ids=["x"], metadatas=[{"x": 9}], embeddings=e([3, 4, 0]))),       # merge, keep document
      ("upsert", dict(ids=["x"], embeddings=e([0, 2, 0]))),                              # keep metadata too
      ("upsert", dict(ids=["y", "z"], metadatas=[{"k": None, "n": [1, 2]}, {"new": True}],
                      embeddings=e([1, 1, 0], [0, 0, 5]), documents=["w2", "zed"])),     # None deletes a key
      ("add", dict(ids=["x", "w"], embeddings=e([9, 9, 9], [1, 2, 3]), documents=["ignored", "w"])),
      ("update", dict(ids=["nope", "w"], metadatas=[{"a": 1}, {"a": 2}])),              # missing id skipped
      ("update", dict(ids=["z"], embeddings=e([0, 1, 1]))),
      ("update", dict(ids=["w"], documents=["new doc"], embeddings=e([2, 2, 2]))),
  ]
  with caplog.at_level(logging.WARNING, logger="memory.collection"):
    for op, kw in steps:
      getattr(ref, op)(**kw)
      getattr(ours, op)(**kw)
  assert any("already present" in r.message and "'x'" in r.message for r in caplog.records)
  assert any("missing" in r.message and "'nope'" in r.message for r in caplog.records)
  a = ours.get(include=("documents", "metadatas", "embeddings"))
  b = ref.get(include=["documents", "metadatas", "embeddings"])
  canon = lambda m: json.dumps(m, sort_keys=True)  # noqa: E731
  assert sorted(zip(a["ids"], a["documents"], map(canon, a["metadatas"]))) == \
      sorted(zip(b["ids"], b["documents"], map(canon, b["metadatas"])))
  order = np.argsort(a["ids"]), np.argsort(b["ids"])
  np.testing.assert_array_equal(a["embeddings"][order[0]], np.asarray(b["embeddings"], np.float32)[order[1]])
  q = e([1, 2, 0])
  assert ours.query(query_embeddings=q, n_results=4, include=())["ids"] == \
      ref.query(query_embeddings=q, n_results=4, include=[])["ids"]


def test_query_filters_against_chroma_on_all_filter_pairs(pair):
  ref, ours, _ = pair
  q = np.random.default_rng(5).normal(size=(2, 8)).astype(np.float32)
  for where, wd in itertools.islice(itertools.product(WHERE[::4], WHERE_DOCUMENT[::3]), 24):
    a = ours.query(query_embeddings=q, n_results=4, where=where, where_document=wd, include=())["ids"]
    b = ref.query(query_embeddings=q, n_results=4, where=where, where_document=wd, include=[])["ids"]
    assert a == b, (where, wd)
