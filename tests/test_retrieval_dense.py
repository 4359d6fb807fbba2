"""DenseIndex: exact search vs NumPy brute force, ANN recall, upsert/delete, persistence in a new process."""
import json
import subprocess
import sys

import numpy as np
import pytest

from retrieval.dense import DenseIndex


def _unit(x):
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  centers = rng.standard_normal((40, 32))
  docs = _unit(centers[rng.integers(0, 40, 4000)] + 0.3 * rng.standard_normal((4000, 32)))
  queries = _unit(centers[rng.integers(0, 40, 50)] + 0.3 * rng.standard_normal((50, 32)))
  return [f"doc-{i}" for i in range(len(docs))], docs, queries


def _brute(docs, queries, k):
  scores = queries @ docs.T
  top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return top, np.take_along_axis(scores, top, 1)


def test_flat_equals_brute_force(data):
  ids, docs, queries = data
  index = DenseIndex(32, "flat")
  index.add(ids, docs)
  results = index.search(queries, 10)
  top, scores = _brute(docs, queries, 10)
  for row, t, s in zip(results, top, scores):
    np.testing.assert_allclose([x for _, x in row], s, rtol=1e-5, atol=1e-6)
    assert [d for d, _ in row] == [ids[i] for i in t]
  assert index.search(queries[0], 10_000)[0][-1][0] in ids  # k capped at the collection size
  assert len(index.search(queries[0], 10_000)[0]) == len(ids)


@pytest.mark.parametrize("kind, options", [("ivf", {"nprobe": 8}), ("hnsw", {}), ("auto", {"ivf_threshold": 1000})])
def test_ann_recall(data, kind, options):
  ids, docs, queries = data
  index = DenseIndex(32, kind, **options)
  index.add(ids[:500], docs[:500])
  index.add(ids[500:], docs[500:])
  assert index.structure == ("ivf" if kind == "auto" else kind)
  top, _ = _brute(docs, queries, 10)
  found = [{int(d.split("-")[1]) for d, _ in row} for row in index.search(queries, 10)]
  recall = np.mean([len(f & set(t)) / 10 for f, t in zip(found, top)])
  assert recall >= 0.9, recall


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_upsert_and_delete(data, kind):
  ids, docs, _ = data
  index = DenseIndex(32, kind)
  index.add(ids[:300], docs[:300])
  with pytest.raises(KeyError, match="doc-5"):
    index.add(["doc-5"], docs[:1])
  assert index.delete(["doc-1", "doc-2", "missing"]) == 2
  assert len(index) == 298 and "doc-1" not in index
  assert all(d not in ("doc-1", "doc-2") for d, _ in index.search(docs[1], 298)[0])
  index.upsert(["doc-3", "doc-new"], docs[[10, 11]])
  assert len(index) == 299
  np.testing.assert_allclose(index.get(["doc-3"])[0], docs[10])
  best = index.search(docs[11], 1)[0][0]
  assert best[0] in ("doc-new", "doc-11") and best[1] == pytest.approx(1.0, abs=1e-5)


def test_bad_input():
  index = DenseIndex(4)
  with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
    index.add(["a", "b"], np.zeros((2, 3)))
  with pytest.raises(ValueError, match="duplicate id 'a'"):
    index.add(["a", "a"], np.zeros((2, 4)))
  with pytest.raises(ValueError, match="NaN"):
    index.add(["a"], np.full((1, 4), np.nan))
  with pytest.raises(ValueError, match="kind='pq'"):
    DenseIndex(4, "pq")


def test_persistence_across_processes(data, tmp_path):
  ids, docs, queries = data
  index = DenseIndex(32, "ivf")
  index.add(ids[:1000], docs[:1000])
  index.delete(["doc-0"])
  index.save(tmp_path / "dense")
  np.save(tmp_path / "queries.npy", queries[:5])
  code = (
      "import json, sys, numpy as np\n"
      "from retrieval.dense import DenseIndex\n"
      f"ix = DenseIndex.load({str(tmp_path / 'dense')!r})\n"
      f"q = np.load({str(tmp_path / 'queries.npy')!r})\n"
      "print(json.dumps({'n': len(ix), 'structure': ix.structure, 'hits': ix.search(q, 5)}))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  loaded = json.loads(out.stdout)
  assert loaded["n"] == 999 and loaded["structure"] == "ivf"
  expected = index.search(queries[:5], 5)
  assert [[d for d, _ in row] for row in loaded["hits"]] == [[d for d, _ in row] for row in expected]
  assert not list(tmp_path.glob(".dense*"))  # no temporary folders left behind



def test_faiss_threads_per_call(monkeypatch):
  """A small query batch searches on one OpenMP thread, a big one on default_threads(); the caller's
  setting is restored afterwards (before: every search used FAISS's default thread count)."""
  import faiss
  from retrieval import threads
  index = DenseIndex(8, "flat")
  rng = np.random.default_rng(0)
  index.add([str(i) for i in range(50)], rng.standard_normal((50, 8)).astype(np.float32))
  seen = []
  search = index.index.search
  monkeypatch.setattr(index.index, "search", lambda *a, **k: (seen.append(faiss.omp_get_max_threads()),
                                                                 search(*a, **k))[1])
  monkeypatch.setattr(threads, "default_threads", lambda: 3)
  monkeypatch.setattr(threads, "MIN_PARALLEL_WORK", 50 * 8 * 20)  # 20 queries over this 50 x 8 index
  before = faiss.omp_get_max_threads()
  faiss.omp_set_num_threads(2)
  try:
    index.search(rng.standard_normal(8), 5)
    index.search(rng.standard_normal((19, 8)), 5)
    index.search(rng.standard_normal((20, 8)), 5)
    assert seen == [1, 1, 3] and faiss.omp_get_max_threads() == 2
    with threads.faiss_threads(num_queries=1) as n:
      assert n == 1 and faiss.omp_get_max_threads() == 1
    assert faiss.omp_get_max_threads() == 2
  finally:
    faiss.omp_set_num_threads(before)
  with pytest.raises(ValueError, match="n=0"):
    with threads.faiss_threads(0):
      pass


def test_default_threads_follows_omp_num_threads(monkeypatch):
  from retrieval import threads
  monkeypatch.setenv("OMP_NUM_THREADS", "5")
  assert threads.default_threads() == 5 and threads.threads_for(1) == 1
  assert threads.threads_for(threads.SMALL_BATCH) == 5 and threads.threads_for(threads.SMALL_BATCH - 1) == 1
  assert threads.threads_for(1, 10**9, 384) == 1  # one query never pays for a thread team
  assert threads.threads_for(2, 10**6, 384) == 5 and threads.threads_for(16, 5183, 384) == 1
  assert threads.threads_for(4, 100_000, 384) == 5
