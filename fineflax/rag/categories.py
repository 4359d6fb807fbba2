"""The request category for contextual routing when the request names none: a rule classifier.

category(question) = the first category, in the config's order, with a regular expression that matches
(`re.search`, case-insensitive) the question; `default` when none does (None: no category, so only the
overall bandit routes it). Chosen because it is transparent, instant and needs no training data; a request's
own `category` field always wins over it.
"""
from __future__ import annotations

import re


class RuleClassifier:
  def __init__(self, categories: dict[str, list[str]], default: str | None = None):
    self.rules = [(c, [re.compile(p, re.IGNORECASE) for p in patterns]) for c, patterns in categories.items()]
    self.default = default

  def __call__(self, question: str) -> str | None:
    for category, patterns in self.rules:
      if any(p.search(question) for p in patterns):
        return category
    return self.default
