"""Search-R1 text protocol, exact-match reward and the generated knowledge base."""
import re
import string

import pytest

from fineflax.rewards.qa import exact_match_score
from fineflax.search_r1 import (Passage, RolloutResult, Tags, build_prompt, format_passages,
                                information_text, make_kb, parse_action, search_r1_reward,
                                turn_is_well_formed)

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("text, expected", [
    ("<think>hm</think>\n<search> who is X </search>", ("search", "who is X")),
    ("<think>ok</think><answer> Paris </answer>", ("answer", "Paris")),
    ("<search>a <search>b</search>", ("search", "b")),              # last opening tag wins
    ("<search> first </search> then <search> second </search>", ("search", "second")),
    ("<search>   </search>", ("invalid", "")),                      # nothing to search for
    ("<answer></answer>", ("answer", "")),
    ("I will search for it", ("invalid", "")),
    ("<search> unclosed", ("invalid", "")),
    ("<search>q</answer>", ("invalid", "")),
])
def test_parse_action(text, expected):
  assert parse_action(text) == expected


def test_parse_action_custom_tags():
  tags = Tags(search="query", answer="final")
  assert parse_action("<query> x </query>", tags) == ("search", "x")
  assert parse_action("<search> x </search>", tags) == ("invalid", "")
  assert tags.stop_strings == ("</query>", "</final>")


def test_passages_and_information_block_match_search_r1():
  # Search-R1 _passages2string on contents '"Title"\ntext' (title line kept, here without quotes)
  docs = [{"contents": "Alpha\nfirst text"}, {"contents": "Beta\nsecond\nline"}]
  reference = ""
  for idx, d in enumerate(docs):
    title, text = d["contents"].split("\n")[0], "\n".join(d["contents"].split("\n")[1:])
    reference += f"Doc {idx + 1}(Title: {title}) {text}\n"
  passages = [Passage("Alpha", "first text"), Passage("Beta", "second\nline")]
  assert format_passages(passages) == reference
  assert information_text(reference) == f"\n\n<information>{reference.strip()}</information>\n\n"
  assert information_text("x", Tags(info="context")) == "\n\n<context>x</context>\n\n"
  assert "Question: Who?\n" in build_prompt("  Who? ") and "<information> and </information>" in build_prompt("q")


def _squad_normalize(s):  # the SQuAD v1.1 script, written out independently
  def remove_articles(t):
    return re.sub(r"\b(a|an|the)\b", " ", t)
  exclude = set(string.punctuation)
  return " ".join(remove_articles("".join(ch for ch in s.lower() if ch not in exclude)).split())


@pytest.mark.parametrize("answer, golden", [
    ("The  Eiffel Tower!", "eiffel tower"), ("an apple", "Apple"), ("U.S.A.", "usa"),
    ("Paris", "Lyon"), ("the", ""), ("Theater", "ater"), ("New-York", "newyork"), ("a b", "b a"),
])
def test_exact_match_is_squad_normalised(answer, golden):
  assert exact_match_score(answer, [golden]) == float(_squad_normalize(answer) == _squad_normalize(golden))


def test_reward_weights_and_format():
  good = RolloutResult(answer=" paris ", queries=["q"], finish="answer",
                       turn_texts=["<think>a</think>\n<search> q </search>", "<think>b</think> <answer> paris </answer>"])
  r, parts = search_r1_reward(good, ["Paris"], em=1.0, format=0.2, search=0.05)
  assert parts == {"em": 1.0, "format": 1.0, "search": 1.0} and r == pytest.approx(1.25)
  no_think = RolloutResult(answer="x", finish="answer", turn_texts=["<answer> x </answer>"])
  r, parts = search_r1_reward(no_think, ["Paris"], em=1.0, format=0.2, search=0.05)
  assert parts == {"em": 0.0, "format": 0.0, "search": 0.0} and r == 0.0
  unanswered = RolloutResult(answer=None, finish="turns", turn_texts=["<think>a</think><search> q </search>"])
  assert search_r1_reward(unanswered, [""])[1]["em"] == 0.0  # no answer never matches
  assert not turn_is_well_formed("<think>a</think><search> q </search><answer>x</answer>")
  assert not turn_is_well_formed("<think>a <information>x</information></think><answer>x</answer>")
  assert not turn_is_well_formed("<think>a</think><search>  </search>")


def test_kb_is_deterministic_split_and_answerable():
  a, b = make_kb(num_people=30, num_cities=8, num_countries=3, seed=5), make_kb(30, 8, 3, seed=5)
  assert a == b and a != make_kb(30, 8, 3, seed=6)
  assert len(a.documents) == 3 + 8 + 2 * 30 and len({d["title"] for d in a.documents}) == len(a.documents)
  train, test = a.split("train"), a.split("test")
  assert len(train) + len(test) == len(a.questions) == 7 * 30 + 8 and test
  text = {d["title"]: d["text"] for d in a.documents}
  mentioned = lambda qs: {t for q in qs for t in text if t in q.question}
  assert mentioned(test) and not mentioned(train) & mentioned(test)  # no entity named in both splits
  for q in a.questions:
    queries = [re.search(r"<search> (.*) </search>", t).group(1) for t in q.demo[:-1]]
    assert len(queries) == q.hops and f"<answer> {q.answer} </answer>" in q.demo[-1]
    assert q.answer in text[queries[-1]]  # the last demonstrated search finds the answer
    for query in queries:
      assert query in text  # every demonstrated search names a passage title
