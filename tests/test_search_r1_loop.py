"""Search-R1 rollout loop driven by a scripted policy: search, invalid action, answer, turn and token
limits, loss mask = the policy's own tokens, failing / slow engines reported in the trace."""
import time

import pytest

from fineflax.search_r1 import (INVALID_ACTION_TEXT, Passage, RolloutConfig, ScriptedPolicy, Tags,
                                make_kb, make_search_fn, run_rollouts)

SEARCH = "<think>I need facts.</think>\n<search> {q} </search>"
ANSWER = "<think>Done.</think>\n<answer> {a} </answer>"


@pytest.fixture(scope="module")
def tok():
  from fineflax.models import load_tokenizer
  return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def kb():
  return make_kb(num_people=8, num_cities=4, num_countries=2, seed=3)


class CountingEngine:
  """An in-process BM25 engine that records every batched call."""

  def __init__(self, documents):
    from retrieval import create_search_engine
    self.engine, self.calls = create_search_engine("bm25", documents), []

  def search_batch(self, queries, k):
    self.calls.append(list(queries))
    return self.engine.search_batch(queries, k)


def _prompts(tok, n):
  return [tok(f"question {i}", add_special_tokens=False)["input_ids"] for i in range(n)]


def _segments(tokens, mask):
  """Maximal runs of equal mask value: [(value, token list)]."""
  out = []
  for t, m in zip(tokens, mask):
    if out and out[-1][0] == m:
      out[-1][1].append(t)
    else:
      out.append((m, [t]))
  return out


def test_search_invalid_answer_and_turn_limit(tok, kb):
  person = kb.documents[-2]["title"]  # the last person
  script = [
      [SEARCH.format(q=person), ANSWER.format(a="Somewhere")],          # search, answer
      ["I am not sure what to do.", ANSWER.format(a="x")],              # invalid (EOS), answer
      [ANSWER.format(a="Paris")],                                       # answers at once
      None,                                                             # always searches
  ]
  looping = lambda row, turn: SEARCH.format(q=f"query {turn}")
  policy = ScriptedPolicy(tok, lambda r, t: looping(r, t) if script[r] is None else script[r][t], eos_id=2)
  engine = CountingEngine(kb.documents)
  cfg = RolloutConfig(max_turns=3, max_turn_tokens=64, max_response_tokens=2000)
  rows = run_rollouts(policy, _prompts(tok, 4), make_search_fn(engine, topk=2), tok, cfg)
  # one batched engine call per turn, holding exactly the rows that searched in that turn
  assert engine.calls == [[person, "query 0"], ["query 1"], ["query 2"]]
  assert [r.answer for r in rows] == ["Somewhere", "x", "Paris", None]
  assert [r.finish for r in rows] == ["answer", "answer", "answer", "turns"]
  assert [r.num_turns for r in rows] == [2, 2, 1, 4]  # the looping row: 3 searches + the final turn
  assert policy.turns_taken == [2, 2, 1, 4]
  assert rows[3].queries == ["query 0", "query 1", "query 2"]  # the final turn's search is not run
  assert rows[0].queries == [person] and rows[1].num_invalid == 1
  hit = engine.engine.search_batch([person], 2)[0]
  assert f"<information>Doc 1(Title: {hit[0].title}) {hit[0].text}\nDoc 2(Title: {hit[1].title})" in rows[0].trace
  assert INVALID_ACTION_TEXT in rows[1].trace
  assert rows[2].trace == ANSWER.format(a="Paris")


def test_loss_mask_covers_exactly_the_policys_tokens(tok, kb):
  person = kb.documents[-2]["title"]
  script = [[SEARCH.format(q=person), "no tags here", ANSWER.format(a="A")]]
  policy = ScriptedPolicy(tok, script, eos_id=2)
  row = run_rollouts(policy, _prompts(tok, 1), make_search_fn(CountingEngine(kb.documents)), tok,
                     RolloutConfig(max_turns=3, max_turn_tokens=64, max_response_tokens=2000))[0]
  assert len(row.tokens) == len(row.loss_mask) == len(row.logprobs)
  segs = _segments(row.tokens, row.loss_mask)
  assert [m for m, _ in segs] == [1.0, 0.0, 1.0, 0.0, 1.0]
  model = [tok.decode(t, skip_special_tokens=True) for m, t in segs if m == 1.0]
  inserted = [tok.decode(t) for m, t in segs if m == 0.0]
  assert model == row.turn_texts == [script[0][0], "no tags here", script[0][2]]
  assert inserted[0].startswith("\n\n<information>Doc 1(Title: ") and inserted[0].endswith("</information>\n\n")
  assert inserted[1] == INVALID_ACTION_TEXT
  assert policy.appended[0] == [t for m, t in segs if m == 0.0]  # what the policy was fed = mask-0 tokens
  assert row.trace == "".join(tok.decode(t, skip_special_tokens=True) for _, t in segs)


def test_token_budget_and_observation_cut(tok, kb):
  looping = lambda row, turn: SEARCH.format(q=kb.documents[-2]["title"])
  cfg = RolloutConfig(max_turns=50, max_turn_tokens=64, max_response_tokens=150, max_obs_tokens=20)
  rows = run_rollouts(ScriptedPolicy(tok, looping), _prompts(tok, 2), make_search_fn(CountingEngine(kb.documents)),
                      tok, cfg)
  for row in rows:
    assert row.finish == "length" and len(row.tokens) <= 150
    for m, t in _segments(row.tokens, row.loss_mask):
      assert m == 1.0 or len(t) == 20  # every inserted block was cut to max_obs_tokens
  long_turn = lambda row, turn: "word " * 100
  row = run_rollouts(ScriptedPolicy(tok, long_turn), _prompts(tok, 1), make_search_fn(CountingEngine(kb.documents)),
                     tok, RolloutConfig(max_turns=0, max_turn_tokens=16))[0]
  assert len(row.tokens) == 16 and row.finish == "turns" and row.answer is None


def test_engine_failure_and_timeout_are_reported_and_rollout_continues(tok):
  def broken(queries, k):
    raise ConnectionError("index offline")

  def slow(queries, k):
    time.sleep(1.0)
    return [[Passage("t", "x")] for _ in queries]

  script = [[SEARCH.format(q="a"), ANSWER.format(a="b")]] * 2
  for tool, timeout, message in ((broken, None, "search failed: ConnectionError: index offline"),
                                 (slow, 0.1, "search failed: SearchTimeout: no answer within 0.1 s")):
    rows = run_rollouts(ScriptedPolicy(tok, script), _prompts(tok, 2), make_search_fn(tool, timeout_s=timeout),
                        tok, RolloutConfig(max_turns=2))
    for row in rows:
      assert f"<information>{message}</information>" in row.trace
      assert row.num_search_failures == 1 and row.answer == "b" and row.finish == "answer"


def test_classic_context_tag(tok, kb):
  tags = Tags(info="context")
  script = [[SEARCH.format(q=kb.documents[-2]["title"]), ANSWER.format(a="y")]]
  row = run_rollouts(ScriptedPolicy(tok, script), _prompts(tok, 1), make_search_fn(CountingEngine(kb.documents)),
                     tok, RolloutConfig(tags=tags))[0]
  assert "\n\n<context>Doc 1(Title: " in row.trace and "</context>\n\n" in row.trace
  assert "<information>" not in row.trace


def test_policy_returning_wrong_rows_is_an_error(tok):
  class Lazy(ScriptedPolicy):
    def decode(self, max_new_tokens, stop_strings):
      turns = super().decode(max_new_tokens, stop_strings)
      return {b: t for b, t in turns.items() if b != 1}
  with pytest.raises(RuntimeError, match=r"expected \[0, 1\]"):
    run_rollouts(Lazy(tok, lambda r, t: "x"), _prompts(tok, 2), make_search_fn(lambda q, k: []), tok)
