"""Chat reward in [0, 1]: W_LENGTH * length + W_REPEAT * (1 - repetition) + W_COPY * copy score.

- length: 1 inside [min_words, max_words] (example fields, defaults 10 / 300), decaying linearly to 0 at
  half the minimum / twice the maximum.
- repetition: 1 - unique/total word n-grams (n = 3) of the completion; 0 for texts under n words.
- copy: fraction c of the completion's n-grams that occur in the prompt; score 1 for c <= COPY_FREE,
  falling linearly to 0 at c = 1.
An empty completion scores 0.
"""
from __future__ import annotations

import re

from fineflax.rewards.registry import register

W_LENGTH, W_REPEAT, W_COPY = 0.4, 0.3, 0.3
NGRAM = 3
COPY_FREE = 0.5
_WORD = re.compile(r"\w+", re.UNICODE)


def _ngrams(words: list[str], n: int = NGRAM) -> list[tuple[str, ...]]:
  return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def length_score(n_words: int, min_words: int, max_words: int) -> float:
  if min_words <= n_words <= max_words:
    return 1.0
  if n_words < min_words:
    return max(0.0, (n_words - min_words / 2) / (min_words / 2))
  return max(0.0, 1.0 - (n_words - max_words) / max_words)


def repetition_ratio(words: list[str]) -> float:
  grams = _ngrams(words)
  return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def copy_ratio(words: list[str], prompt_words: list[str]) -> float:
  grams = _ngrams(words)
  if not grams:
    return 0.0
  prompt_grams = set(_ngrams(prompt_words))
  return sum(g in prompt_grams for g in grams) / len(grams)


@register("chat")
def chat_reward(prompt: str, completion: str, **example) -> float:
  words = _WORD.findall(completion.lower())
  if not words:
    return 0.0
  length = length_score(len(words), int(example.get("min_words", 10)), int(example.get("max_words", 300)))
  copy = copy_ratio(words, _WORD.findall(prompt.lower()))
  copy_score = 1.0 if copy <= COPY_FREE else (1.0 - copy) / (1.0 - COPY_FREE)
  return W_LENGTH * length + W_REPEAT * (1.0 - repetition_ratio(words)) + W_COPY * copy_score
