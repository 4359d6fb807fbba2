"""No fact a held-out Search-R1 question needs is stated in anything the policy trains on: the training
questions' prompts, their scripted demonstrations (LUFFY guidance rows and SFT rows are these turns), for the
knowledge bases of configs/search_r1.py (default and smoke sizes) and several KB seeds."""
from __future__ import annotations

import re

import pytest

from fineflax.jobs.resolve import load_config
from fineflax.search_r1 import build_prompt, make_kb

pytestmark = pytest.mark.fast


def _kb(preset: str, seed: int):
  k = load_config(f"configs/search_r1.py:{preset}").kb
  return make_kb(k.num_people, k.num_cities, k.num_countries, k.test_fraction, seed)


def statements(question) -> list[str]:
  """The facts a question's own demonstration states in its thoughts ("C is in X.", "P was born in C."):
  every sentence of its <think> blocks that is not a plan ("I need ...", "Now I need ...")."""
  thoughts = re.findall(r"<think>(.*?)</think>", "".join(question.demo), re.S)
  sentences = [s.strip() for t in thoughts for s in re.findall(r"[^.]*\.", t)]
  return [s for s in sentences if s and "I need" not in s]


def names(text: str) -> set[str]:
  """Word 1- and 2-grams of `text`: every entity name of the knowledge base is one or two words."""
  words = re.findall(r"[A-Za-z]+", text)
  return set(words) | {f"{a} {b}" for a, b in zip(words, words[1:])}


def training_text(kb) -> str:
  """Everything the policy is trained on for the training questions (prompt and demonstration turns)."""
  return "\n".join(build_prompt(q.question) + "".join(q.demo) for q in kb.split("train"))


@pytest.mark.parametrize("preset,seed", [("", 0), ("", 1), ("", 2), ("smoke", 0), ("smoke", 3)])
def test_no_held_out_fact_or_entity_in_training_text(preset, seed):
  kb = _kb(preset, seed)
  train, test = training_text(kb), kb.split("test")
  assert test and train
  countries = {d["title"] for d in kb.documents if d["id"].startswith("country-")}
  leaked_facts = [(q.question, s) for q in test for s in statements(q) if s in train]
  assert all(statements(q) for q in test)
  assert leaked_facts == []
  # stronger: no held-out person, company or city (what every needed fact is about) is named at all
  entities = {d["title"] for d in kb.documents} - countries
  held_out = set().union(*(names(q.question + "".join(q.demo)) for q in test)) & entities
  assert held_out and not held_out & names(train)


def test_held_out_questions_stay_answerable_from_the_corpus():
  """The split takes nothing out of the corpus: each held-out demonstration's last search is a passage title
  whose text holds the answer, and the facts of its thoughts are in the corpus."""
  kb = _kb("", 0)
  text = {d["title"]: d["text"] for d in kb.documents}
  passages = [names(t) for t in text.values()]
  for q in kb.split("test"):
    last_query = re.findall(r"<search> (.*?) </search>", "".join(q.demo))[-1]
    assert q.answer in text[last_query]
    for s in statements(q):  # "P was born in C." -> one passage names both
      said = names(s) & set(text)
      assert len(said) == 2 and any(said <= p for p in passages), s


def test_too_few_cities_for_a_split_is_a_clear_error():
  with pytest.raises(ValueError, match="1 cities leave none for the training people"):
    make_kb(num_people=10, num_cities=1, num_countries=1, test_fraction=0.5)
