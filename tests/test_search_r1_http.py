"""The search tool against a real Search-R1 retrieval server on 127.0.0.1: same passages and the same
rollout trace as the in-process engine; a dead server is reported in the trace."""
import socket

import pytest

from fineflax.search_r1 import RolloutConfig, ScriptedPolicy, make_kb, make_search_fn, run_rollouts


@pytest.fixture(scope="module")
def served():
  from fineflax.models import load_tokenizer
  from retrieval import create_search_engine
  from retrieval.server import RetrievalServer
  kb = make_kb(num_people=10, num_cities=4, num_countries=2, seed=2)
  engine = create_search_engine("bm25", kb.documents)
  with RetrievalServer(engine, "127.0.0.1", 0) as server:
    yield kb, engine, server.url, load_tokenizer("smollm2-135m-instruct")


def test_http_passages_equal_in_process(served):
  kb, engine, url, _ = served
  queries = [kb.documents[-1]["title"], kb.questions[4].question, "Nothing matches zzzz"]
  over_http = make_search_fn(url, topk=3, timeout_s=10)(queries)
  local = make_search_fn(engine, topk=3)(queries)
  assert over_http == local and len(over_http[0]) == 3


def test_rollout_over_http_and_dead_server(served):
  kb, engine, url, tok = served
  q = kb.split("train")[0]
  prompts = [tok(q.question, add_special_tokens=False)["input_ids"]]
  cfg = RolloutConfig(max_turns=3)
  run = lambda tool: run_rollouts(ScriptedPolicy(tok, [list(q.demo)]), prompts, make_search_fn(tool, timeout_s=10),
                                  tok, cfg)[0]
  remote, local = run(url), run(engine)
  assert remote.trace == local.trace and remote.tokens == local.tokens
  assert remote.answer == q.answer and remote.queries and remote.num_search_failures == 0
  with socket.socket() as s:  # a port with nothing listening
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}/retrieve"
  failed = run(dead)
  assert "<information>search failed: URLError" in failed.trace
  assert failed.num_search_failures == q.hops and failed.answer == q.answer  # the script still answers
