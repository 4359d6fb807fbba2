"""RAG variants served by `python -m fineflax.serve` (tiny random model, BM25 over a small corpus): the logged
passages are retrieval/'s for the question, retrieval runs off the event loop (two requests meet inside it),
categories reach the router, the statistics and the leaderboard."""
import json
import sqlite3
import threading

import openai
import pytest

from fineflax.testing.serve import free_port, server_argv, thread_server, tiny_chat_model, write_adapters
from retrieval.documents import read_jsonl
from retrieval.engine import create_search_engine

DOCS = [{"id": f"d{i}", "title": t, "text": x} for i, (t, x) in enumerate([
    ("Vorland", "Vorland is a country. Its largest river is the Olm."),
    ("Kaford", "Kaford is a city in Vorland. About 20000 people live there."),
    ("Ada Mirzen", "Ada Mirzen is a painter born in Kaford in 1950."),
    ("Tharo Labs", "Tharo Labs is a glass company founded by Ada Mirzen."),
])]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  root = tmp_path_factory.mktemp("serve_rag")
  model = tiny_chat_model(root)
  adapters = write_adapters(model, root)
  corpus = root / "kb.jsonl"
  corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
  config = root / "rag.json"
  config.write_text(json.dumps({
      "retrievers": {"bm25": {"kind": "bm25", "corpus": "kb.jsonl"}},
      "variants": {"naive_rag": {"retriever": "bm25", "k": 2, "generator": "alpha"},
                   "agentic_rag": {"retriever": "bm25", "k": 1, "max_turns": 1, "max_turn_tokens": 8},
                   "no_rag": {}},
      "categories": {"people": ["born"], "places": ["country|city"]},
      "priors": {"no_rag": {"by_category": {"people": {"n": 50, "mean": 0.9}}},
                 "naive_rag": {"by_category": {"people": {"n": 20, "mean": 0.2}}},
                 "agentic_rag": {"by_category": {"people": {"n": 20, "mean": 0.1}}}}}))
  argv = server_argv(model, adapters, root / "log.sqlite", free_port(), "--rag-config", str(config),
                     "--auto-variants", "naive_rag,agentic_rag,no_rag", "--router", "ucb1", "--context", "512")
  with thread_server(argv) as (url, server):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    yield {"url": url, "server": server, "client": client, "corpus": corpus, "log": root / "log.sqlite"}


def logged(served, rid):
  db = sqlite3.connect(served["log"])
  row = db.execute("SELECT variant, question, category, passages_json, input_json, trace, answer FROM responses "
                   "WHERE id = ?", (rid,)).fetchone()
  db.close()
  return row


def test_naive_rag_logs_what_retrieval_returns_and_answers_from_it(served):
  c = served["client"]
  assert {"naive_rag", "agentic_rag", "no_rag", "auto"} <= {m.id for m in c.models.list().data}
  q = "Where was Ada Mirzen born?"
  r = c.chat.completions.create(model="naive_rag", messages=[{"role": "user", "content": q}], max_tokens=4,
                                temperature=0)
  variant, question, category, passages, inputs, trace, answer = logged(served, r.id)
  want = create_search_engine("bm25", read_jsonl(served["corpus"])).search(q, 2)
  assert (variant, question, category, trace) == ("naive_rag", q, "people", None)
  assert json.loads(passages) == [{"id": h.id, "title": h.title, "text": h.text} for h in want]
  inputs = json.loads(inputs)
  assert inputs[-1] == {"role": "user", "content": q} and all(h.text in inputs[0]["content"] for h in want)
  assert answer == r.choices[0].message.content
  stream = c.chat.completions.create(model="naive_rag", messages=[{"role": "user", "content": q}], max_tokens=4,
                                     temperature=0, stream=True)
  assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == answer


def test_an_adapter_generates_for_its_rag_variant(served):
  """naive_rag declares generator=alpha (an adapter: how a trained student is served as an arm): its answer
  is alpha's on the messages it logged, not the base model's."""
  c = served["client"]
  q = "Where was Ada Mirzen born?"
  r = c.chat.completions.create(model="naive_rag", messages=[{"role": "user", "content": q}], max_tokens=6,
                                temperature=0)
  inputs = json.loads(logged(served, r.id)[4])
  answer = lambda model: c.chat.completions.create(model=model, messages=inputs, max_tokens=6,
                                                   temperature=0).choices[0].message.content
  base = next(m.id for m in c.models.list().data if m.id not in ("alpha", "beta", "auto", "naive_rag",
                                                                  "agentic_rag", "no_rag"))
  assert r.choices[0].message.content == answer("alpha") != answer(base)


def test_agentic_and_no_rag_answer_and_log(served):
  c = served["client"]
  q = "In which country is Kaford?"
  r = c.chat.completions.create(model="agentic_rag", messages=[{"role": "user", "content": q}], max_tokens=64,
                                temperature=0)
  variant, question, category, passages, inputs, trace, answer = logged(served, r.id)
  assert (variant, question, category) == ("agentic_rag", q, "places") and trace and answer == r.choices[0].message.content
  assert json.loads(inputs)[-1] == {"role": "user", "content": q}
  with pytest.raises(openai.BadRequestError, match="n = 1"):
    c.chat.completions.create(model="agentic_rag", messages=[{"role": "user", "content": q}], n=2, max_tokens=8)
  r = c.chat.completions.create(model="no_rag", messages=[{"role": "user", "content": q}], max_tokens=3)
  row = logged(served, r.id)
  assert json.loads(row[3]) == [] and json.loads(row[4]) == [{"role": "user", "content": q}]
  with pytest.raises(openai.NotFoundError, match="'smart_rag' not found"):
    c.chat.completions.create(model="smart_rag", messages=[{"role": "user", "content": q}], max_tokens=3)


def test_retrieval_runs_off_the_event_loop(served):
  """Two requests must be inside retrieval at once (a barrier of 2), which a serialised retrieval never is."""
  server = served["server"]
  inner = server.rag.retrievers["bm25"]
  barrier = threading.Barrier(2, timeout=60)

  class Meeting:
    def search_batch(self, queries, k):
      barrier.wait()
      return inner.search_batch(queries, k)
  server.rag.retrievers["bm25"] = Meeting()
  try:
    results = [None, None]

    def ask(i):
      results[i] = served["client"].chat.completions.create(
          model="naive_rag", messages=[{"role": "user", "content": f"Kaford {i}"}], max_tokens=2)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=120)
    assert all(r is not None and r.model == "naive_rag" for r in results)
  finally:
    server.rag.retrievers["bm25"] = inner


def test_categories_route_feed_the_router_and_the_leaderboard(served):
  c, url = served["client"], served["url"]
  import urllib.request
  get = lambda path: json.loads(urllib.request.urlopen(url + path, timeout=60).read())
  post = lambda path, body: urllib.request.urlopen(urllib.request.Request(
      url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}), timeout=60).read()
  # the priors among "people" (no_rag: 50 pseudo-rewards of mean 0.9; the others 20 of 0.2 and 0.1): UCB1
  # scores 0.9 + sqrt(2 ln 90 / 50) = 1.32 against 0.2 + sqrt(2 ln 90 / 20) = 0.87 and 0.77
  r = c.chat.completions.create(model="auto", messages=[{"role": "user", "content": "Who was born in Kaford?"}],
                                max_tokens=2)
  assert r.model == "no_rag"
  rewards = {"naive_rag": 1.0, "no_rag": 0.0, "agentic_rag": 0.5}
  for v, reward in rewards.items():
    for _ in range(2):
      r = c.chat.completions.create(model=v, messages=[{"role": "user", "content": "Olm river"}], max_tokens=2,
                                    extra_body={"category": "rivers"})
      post("/feedback", {"id": r.id, "reward": reward})
  stats = get("/rl/stats")
  assert {v: s["n"] for v, s in stats["router"]["categories"]["rivers"].items()} == {v: 2 for v in rewards}
  assert stats["router"]["categories"]["people"]["no_rag"]["n"] == 50
  assert stats["categories"]["rivers"]["naive_rag"]["mean_reward"] == 1.0
  board = get("/rl/leaderboard")["leaderboard"]["rivers"]
  assert [row["variant"] for row in board] == ["naive_rag", "agentic_rag", "no_rag"]
  assert board[0]["feedback"] == 2 and board[0]["ci95"] == [1.0, 1.0]
  r = c.chat.completions.create(model="auto", messages=[{"role": "user", "content": "Olm"}], max_tokens=2,
                                extra_body={"category": "rivers"})
  assert r.model == "naive_rag"  # UCB1 on the category's statistics: 1 + sqrt(2 ln 6 / 2) beats the others
