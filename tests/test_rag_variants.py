"""RAG variants (fineflax.rag): each variant's context equals retrieval/ (or memory/) called directly with the
same query; the agentic variant's searches go through the Search-R1 loop; bad declarations are one line."""
import json
import subprocess
import sys

import numpy as np
import pytest

from fineflax.agents.llm import ScriptedLLM
from fineflax.rag.agents import context_messages, question_of, retrieve, run_agentic
from fineflax.rag.categories import RuleClassifier
from fineflax.rag.retrievers import build_retriever
from fineflax.rag.spec import RagConfigError, from_args, load_config
from memory.hashing import hashed_bow
from retrieval.documents import read_jsonl
from retrieval.engine import create_search_engine

pytestmark = pytest.mark.fast

DOCS = [{"id": f"d{i}", "title": t, "text": x} for i, (t, x) in enumerate([
    ("Vorland", "Vorland is a country. Its largest river is the Olm."),
    ("Kaford", "Kaford is a city in Vorland. About 20000 people live there."),
    ("Ada Mirzen", "Ada Mirzen is a painter born in Kaford in 1950. Ada Mirzen founded Tharo Labs."),
    ("Tharo Labs", "Tharo Labs is a glass company founded in 1980 by Ada Mirzen, headquartered in Kaford."),
    ("Ulbre", "Ulbre is a country. Its largest river is the Tesk."),
    ("Zenport", "Zenport is a city in Ulbre. About 90000 people live there."),
])]
QUESTIONS = ["Where was Ada Mirzen born?", "Which country is Kaford in?", "glass company headquarters"]


class HashEmbedder:
  """memory.hashing's bag-of-words vectors as a retrieval Embedder (no model)."""
  dim = 64

  def encode(self, texts, batch_size=64, show_progress=None):
    return hashed_bow(list(texts), self.dim)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  path = tmp_path_factory.mktemp("rag") / "kb.jsonl"
  path.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
  return path


def write_config(path, corpus, **extra):
  config = {"retrievers": {"bm25": {"kind": "bm25", "corpus": str(corpus)},
                           "dense": {"kind": "vector", "corpus": str(corpus)},
                           "hybrid": {"kind": "hybrid", "corpus": str(corpus)}},
            "variants": {"naive_rag": {"retriever": "dense", "k": 2}, "bm25_rag": {"kind": "naive_rag",
                                                                                    "retriever": "bm25"},
                         "hybrid_rag": {"retriever": "hybrid", "k": 3}, "agentic_rag": {"retriever": "bm25", "k": 2},
                         "no_rag": {}},
            "categories": {"multi_hop": ["country .* born"], "keyword": ["^[a-z ]+$"]}}
  config.update(extra)
  path.write_text(json.dumps(config))
  return path


def test_each_variant_retrieves_what_retrieval_gives_for_the_same_query(corpus, tmp_path):
  config = from_args(write_config(tmp_path / "rag.json", corpus))
  retrievers = {n: build_retriever(s, embedder=HashEmbedder()) for n, s in config.retrievers.items()}
  direct = {kind: create_search_engine(kind, read_jsonl(corpus), embedder=HashEmbedder())
            for kind in ("bm25", "vector", "hybrid")}
  for name, v in config.variants.items():
    for q in QUESTIONS:
      got = retrieve(v, retrievers.get(v.retriever), q)
      if v.kind == "no_rag":
        assert got == []
        continue
      kind = config.retrievers[v.retriever]["kind"]
      want = direct[kind].search(q, v.k)
      assert [(h.id, h.text) for h in got] == [(h.id, h.text) for h in want], (name, q)
      assert [h.score for h in got] == pytest.approx([h.score for h in want])
  assert len({tuple(h.id for h in retrieve(config.variants[n], retrievers[config.variants[n].retriever], QUESTIONS[2]))
              for n in ("naive_rag", "bm25_rag")}) == 2  # the strategies differ on this query


def test_context_messages_hold_the_passages_and_the_request(corpus, tmp_path):
  config = from_args(write_config(tmp_path / "rag.json", corpus))
  hits = create_search_engine("bm25", read_jsonl(corpus)).search(QUESTIONS[0], 2)
  msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": QUESTIONS[0]}]
  out = context_messages(config.variants["bm25_rag"], msgs, hits)
  assert [m["role"] for m in out] == ["system", "user"] and out[1] == msgs[1]
  assert f"Doc 1(Title: {hits[0].title}) {hits[0].text}" in out[0]["content"]
  assert out[0]["content"].endswith("Be terse.") and "{passages}" not in out[0]["content"]
  assert context_messages(config.variants["no_rag"], msgs, []) == msgs
  assert question_of(msgs) == QUESTIONS[0]


def test_agentic_variant_searches_through_the_search_r1_loop(corpus, tmp_path):
  from fineflax.models import load_tokenizer
  tok = load_tokenizer("smollm2-135m-instruct")
  config = from_args(write_config(tmp_path / "rag.json", corpus))
  engine = create_search_engine("bm25", read_jsonl(corpus))
  turns = ["<think>find the person</think>\n<search> Ada Mirzen born </search>",
           "<think>now the city</think>\n<search> Kaford country </search>",
           "<think>done</think>\n<answer> Vorland </answer>"]
  llm = ScriptedLLM(lambda request, i: turns[i], tokenizer=tok)
  out = run_agentic(config.variants["agentic_rag"], engine, "In which country was Ada Mirzen born?", llm, tok)
  assert out.answer == "Vorland" and out.rollout.queries == ["Ada Mirzen born", "Kaford country"]
  want = [h.id for q in out.rollout.queries for h in engine.search(q, 2)]
  assert [p["id"] for p in out.passages] == list(dict.fromkeys(want))
  assert all(p["text"] == next(d["text"] for d in DOCS if d["id"] == p["id"]) for p in out.passages)
  assert "<information>Doc 1(Title:" in out.rollout.trace
  assert out.input[-1] == {"role": "user", "content": "In which country was Ada Mirzen born?"}
  assert all(p["text"] in out.input[0]["content"] for p in out.passages)


def test_memory_store_retriever_equals_the_collection_query(tmp_path):
  from memory.store import VectorStore
  from fineflax.rag.spec import retriever_from
  store = VectorStore(tmp_path / "store")
  col = store.get_or_create_collection("kb", embedding_function=lambda t: hashed_bow(list(t), 64),
                                       metadata={"hnsw:space": "cosine"})
  col.add(ids=[d["id"] for d in DOCS], documents=[d["text"] for d in DOCS],
          metadatas=[{"title": d["title"]} for d in DOCS])
  spec = retriever_from("mem", {"store": str(tmp_path / "store"), "collection": "kb"}, "--retriever mem", None)
  retriever = build_retriever(spec, embedder=lambda t: hashed_bow(list(t), 64))
  for q in QUESTIONS:
    got = retriever.search_batch([q], 3)[0]
    res = col.query(query_texts=[q], n_results=3)
    assert [h.id for h in got] == res["ids"][0] and [h.text for h in got] == res["documents"][0]
    assert [h.title for h in got] == [m["title"] for m in res["metadatas"][0]]


def test_rule_classifier_takes_the_first_matching_category(corpus, tmp_path):
  config = load_config(write_config(tmp_path / "rag.json", corpus))
  classify = RuleClassifier(config.categories, default="other")
  assert [classify(q) for q in ("In which country was Ada born?", "glass company", "Who is Ada?")] == [
      "multi_hop", "keyword", "other"]


@pytest.mark.parametrize("change, message", [
    ({"variants": {"x": {"kind": "smart_rag", "retriever": "bm25"}}}, "variants.x.kind='smart_rag': choose one of"),
    ({"variants": {"naive_rag": {}}}, "variants.naive_rag: a naive_rag variant needs retriever=NAME"),
    ({"variants": {"naive_rag": {"retriever": "nope"}}}, "retriever='nope' is not declared"),
    ({"variants": {"hybrid_rag": {"retriever": "bm25"}}}, "needs a retriever of kind hybrid; 'bm25' is bm25"),
    ({"variants": {"naive_rag": {"retriever": "bm25", "k": 0}}}, "variants.naive_rag.k=0: expected an integer >= 1"),
    ({"variants": {"naive_rag": {"retriever": "bm25", "topk": 2}}}, "unknown field 'topk'"),
    ({"priors": {"ghost": {"n": 3, "mean": 0.5}}}, "priors.ghost: unknown variant 'ghost'"),
    ({"priors": {"no_rag": {"by_category": {"kw": {"n": 3}}}}}, "priors.no_rag.by_category.kw: expected"),
    ({"categories": {"kw": ["("]}}, "categories.kw: '(' is not a regular expression"),
    ({"retrievers": {"bm25": {"kind": "bm25", "corpus": "missing.jsonl"}}}, "corpus="),
])
def test_bad_config_is_one_line_naming_the_field(corpus, tmp_path, change, message):
  base = json.loads(write_config(tmp_path / "base.json", corpus).read_text())
  for section, value in change.items():
    base[section] = value if section != "variants" else {**value}
  path = tmp_path / "rag.json"
  path.write_text(json.dumps(base))
  with pytest.raises(RagConfigError) as e:
    from_args(path)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_cli_entries_parse_like_the_file_and_clash(corpus, tmp_path):
  config = from_args(None, rag=["naive_rag:retriever=dense,k=4,generator=alpha"],
                     retrievers=[f"dense:kind=vector,corpus={corpus}"])
  v = config.variants["naive_rag"]
  assert (v.kind, v.retriever, v.k, v.generator) == ("naive_rag", "dense", 4, "alpha")
  with pytest.raises(RagConfigError, match="declared twice"):
    from_args(write_config(tmp_path / "rag.json", corpus), rag=["naive_rag:retriever=bm25"])
  with pytest.raises(RagConfigError, match="is not key=value"):
    from_args(None, rag=["naive_rag:retriever"])


def test_serve_cli_rejects_a_bad_rag_config_or_unknown_variant_in_one_line(corpus, tmp_path):
  bad = tmp_path / "bad.json"
  bad.write_text('{"variants": {"naive_rag": {"retriever": "bm25"}')
  good = write_config(tmp_path / "rag.json", corpus)
  for extra, message in [(["--rag-config", str(bad)], "invalid JSON"),
                         (["--rag-config", str(good), "--auto-variants", "naive_rag,ghost_rag"],
                          "--auto-variants: unknown ['ghost_rag']")]:
    r = subprocess.run([sys.executable, "-m", "fineflax.serve", "--model", "smollm2-135m-instruct", *extra],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
