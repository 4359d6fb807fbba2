"""Exact match after SQuAD v1.1 normalisation (the Search-R1 outcome reward).

normalize_answer(s) = white_space_fix(remove_articles(remove_punc(lower(s)))), as in the official SQuAD
v1.1 evaluation script: punctuation is `string.punctuation`, articles are the words a/an/the.
"""
from __future__ import annotations

import re
import string
from typing import Any

from fineflax.rewards.registry import register

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def normalize_answer(s: str) -> str:
  s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
  return " ".join(_ARTICLES.sub(" ", s).split())


def extract_answer(text: str) -> str | None:
  """Content of the last complete `<answer>...</answer>` in `text`, stripped; None when there is none."""
  matches = _ANSWER.findall(text)
  return matches[-1].strip() if matches else None


def golden_answers(example: dict[str, Any]) -> list[str]:
  """The reference answers of a row: `golden_answers` or `answer` (a str or any iterable of str)."""
  for key in ("golden_answers", "answer", "ground_truth"):
    if key in example and example[key] is not None:
      value = example[key]
      if isinstance(value, dict) and "target" in value:  # Search-R1 parquet: {"target": [...]}
        value = value["target"]
      return [value] if isinstance(value, str) else [str(v) for v in value]
  raise KeyError(f"exact_match needs `golden_answers` or `answer` in the example; got keys {sorted(example)}")


def exact_match_score(answer: str | None, golden) -> float:
  """1.0 iff `answer` equals a golden answer (str or list) after SQuAD normalisation; 0 for no answer."""
  if answer is None:
    return 0.0
  golden = [golden] if isinstance(golden, str) else golden
  guess = normalize_answer(answer)
  return float(any(guess == normalize_answer(g) for g in golden))


@register("exact_match")
def exact_match_reward(prompt: str, completion: str, **example) -> float:
  """EM of the final <answer>...</answer> of the completion; a completion with no <answer> scores 0
  (Search-R1's `qa_em`)."""
  del prompt
  return exact_match_score(extract_answer(completion), golden_answers(example))


@register("exact_match_lenient")
def exact_match_lenient_reward(prompt: str, completion: str, **example) -> float:
  """EM of the final <answer> when there is one, else of the whole completion text."""
  del prompt
  answer = extract_answer(completion)
  return exact_match_score(completion if answer is None else answer, golden_answers(example))
