"""BM25Index against rank-bm25 (an independent implementation) on the same tokens."""
import numpy as np
import pytest
import rank_bm25

from retrieval.bm25 import BM25Index

pytestmark = pytest.mark.fast

CORPUS = [
    "Protein folding is driven by hydrophobic collapse in water.",
    "The mitochondria produce ATP through oxidative phosphorylation.",
    "Amyloid fibrils accumulate in the brains of Alzheimer patients.",
    "Hydrophobic residues bury themselves inside folded proteins, away from water.",
    "Vaccines train the adaptive immune system using antigens.",
    "T cells and B cells form the adaptive immune response.",
    "Insulin regulates glucose uptake in muscle and fat tissue.",
    "Glucose metabolism is impaired in type 2 diabetes.",
    "Oxidative stress damages DNA and proteins in ageing cells.",
    "Deep sequencing reveals the diversity of gut bacteria.",
    "The gut microbiome influences the immune system.",
    "Proteins, proteins and more proteins: a review of proteomics.",
]
QUERIES = ["protein folding in water", "immune system cells", "glucose insulin diabetes", "proteins"]


@pytest.fixture(scope="module")
def tokens():
  ix = BM25Index(stopwords="en", stemmer="english")
  return ix.tokenize(CORPUS), ix.tokenize(QUERIES)


@pytest.mark.parametrize("method, reference, scale", [
    ("robertson", rank_bm25.BM25Okapi, 1.5 + 1.0),  # bm25s drops Okapi's (k1 + 1) factor, as Lucene does
    # No "bm25l" case: rank-bm25's BM25L multiplies by an extra tf factor (not in Lv & Zhai 2011).
    ("bm25+", rank_bm25.BM25Plus, 1.0),
])
def test_scores_match_rank_bm25(tokens, method, reference, scale):
  doc_tokens, query_tokens = tokens
  ix = BM25Index(method=method, k1=1.5, b=0.75, delta=0.5)
  ix.index([f"d{i}" for i in range(len(CORPUS))], CORPUS)
  ref = reference(doc_tokens, k1=1.5, b=0.75, **({"delta": 0.5} if method != "robertson" else {}))
  n = len(CORPUS)
  for query, q_tokens in zip(QUERIES, query_tokens):
    # All query terms occur in fewer than half the documents, so Okapi's idf is positive and rank-bm25's
    # epsilon floor (eps * mean idf for negative idfs; bm25s floors at 0 instead) does not apply.
    assert all(sum(t in d for d in doc_tokens) < n / 2 for t in q_tokens)
    np.testing.assert_allclose(scale * ix.get_scores(query), ref.get_scores(q_tokens), rtol=1e-5, atol=1e-6)


def test_okapi_epsilon_floor_differs_for_common_terms():
  docs = [["common", "a%d" % i] for i in range(9)] + [["rare", "common"]]
  ref = rank_bm25.BM25Okapi(docs, epsilon=0.25)
  ix = BM25Index(method="robertson", stopwords=None, stemmer=None)
  ix.index([str(i) for i in range(10)], [" ".join(d) for d in docs])
  assert ref.idf["common"] == pytest.approx(0.25 * ref.average_idf)  # rank-bm25: epsilon floor
  assert np.all(ix.get_scores("common") == 0)  # bm25s: idf floored at 0
  assert ix.get_scores("rare")[9] * 2.5 == pytest.approx(ref.get_scores(["rare"])[9], rel=1e-5)


def test_lucene_ranking_and_persistence(tmp_path):
  ix = BM25Index()
  ids = [f"d{i}" for i in range(len(CORPUS))]
  ix.index(ids, CORPUS)
  results = ix.search(QUERIES + ["zzzz unknownword"], k=3)
  for query, hits in zip(QUERIES, results):
    scores = ix.get_scores(query)
    best = np.argsort(-scores, kind="stable")[:3]
    assert [h for h, _ in hits] == [ids[i] for i in best if scores[i] > 0]
    np.testing.assert_allclose([s for _, s in hits], scores[best][:len(hits)], rtol=1e-6)
  assert results[-1] == []
  assert len(ix.search(["proteins"], k=1000)[0]) == sum(ix.get_scores("proteins") > 0)
  ix.save(tmp_path / "bm25")
  ix.save(tmp_path / "bm25")  # overwrite in place
  loaded = BM25Index.load(tmp_path / "bm25")
  assert loaded.config == ix.config
  assert loaded.search(QUERIES, k=3) == results[:-1]


def test_bad_input_errors():
  with pytest.raises(ValueError, match="method='okapi'"):
    BM25Index(method="okapi")
  ix = BM25Index()
  with pytest.raises(RuntimeError, match="index"):
    ix.search(["x"], 3)
  with pytest.raises(ValueError, match="duplicate id 'a'"):
    ix.index(["a", "a"], ["x", "y"])


def test_fast_query_path_equals_bm25s_retrieve():
  """The per-query path (own tokenizer + top_k) returns what bm25s.tokenize + BM25.retrieve (JAX top-k) do,
  ties included (duplicated documents score equally; the lower index comes first)."""
  texts = CORPUS + CORPUS[:4] + ["", "THE and OF", "Ünïcödé prötein-folding 2024 x1 ab"]
  ix = BM25Index()
  ix.index([f"d{i}" for i in range(len(texts))], texts)
  queries = QUERIES + ["", "the of and", "Protein PROTEINS proteins", "prötein folding 2024", "zzz unknown"]
  for q in queries:
    assert ix._query_tokens(q) == ix.tokenize([q])[0]
  got = ix.search(queries, 6)
  tokens = [[t for t in q if t in ix._model.vocab_dict] for q in ix.tokenize(queries)]
  docs, scores = ix._model.retrieve(tokens, k=6, show_progress=False, backend_selection="jax")
  expected = [[(ix.ids[d], float(s)) for d, s in zip(dr, sr) if s > 0] for dr, sr in zip(docs, scores)]
  assert got == expected
  assert any(len({s for _, s in row}) < len(row) for row in got)  # a tie was exercised
  assert ix.search(queries, 6, n_threads=1) == expected  # bm25s' own retrieve path
