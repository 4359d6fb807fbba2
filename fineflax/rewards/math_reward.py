"""Math answer reward: 1.0 iff the final answer is equivalent to the reference (see math_equiv).

Final answer of a completion, first that exists: the content of the last complete top-level
`\\boxed{...}` / `\\fbox{...}` (balanced braces; nested boxes are unwrapped; an unclosed box is ignored),
the last `<answer>...</answer>`, and, only with `fallback_last_number=True` (registered as
`math_last_number`), the last number in the text. Reference: `answer`, `ground_truth` or `solution`
(its boxed part if it has one; GSM8K's `#### 72` gives 72); with `fallback_last_number` its answer is
extracted the same way as the completion's, so a reference sentence ("90 + 23 = 113.") gives 113 (a
reference with no number is used whole).
"""
from __future__ import annotations

import functools
import re

from fineflax.rewards.math_equiv import math_equal
from fineflax.rewards.qa import extract_answer
from fineflax.rewards.registry import register

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_LAST_NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?|[+-]?\.\d+")


def _close_brace(text: str, open_end: int) -> int | None:
  """Index just past the brace that closes the one ending at `open_end`, or None if unclosed."""
  depth = 1
  for i in range(open_end, len(text)):
    depth += {"{": 1, "}": -1}.get(text[i], 0)
    if depth == 0:
      return i + 1
  return None


def _boxed_contents(text: str) -> list[str]:
  """Contents of the complete top-level boxes, left to right."""
  out, pos = [], 0
  while m := _BOX_OPEN.search(text, pos):
    end = _close_brace(text, m.end())
    if end is None:  # unclosed: skip this opening, keep scanning
      pos = m.end()
      continue
    out.append(text[m.end():end - 1])
    pos = end
  return out


def last_boxed(text: str) -> str | None:
  boxes = _boxed_contents(text)
  if not boxes:
    return None
  content = boxes[-1].strip()
  while (m := _BOX_OPEN.match(content)) and _close_brace(content, m.end()) == len(content):
    content = content[m.end():-1].strip()  # \boxed{\boxed{x}} -> x
  return content


def extract_math_answer(text: str, fallback_last_number: bool = False) -> str | None:
  boxed = last_boxed(text)
  if boxed is not None:
    return boxed
  tagged = extract_answer(text)
  if tagged is not None:
    return tagged
  if fallback_last_number:
    numbers = _LAST_NUMBER.findall(text)
    return numbers[-1].rstrip(".,") if numbers else None
  return None


def reference_answer(example: dict, fallback_last_number: bool = False) -> str:
  for key in ("answer", "ground_truth", "solution"):
    value = example.get(key)
    if value is None:
      continue
    value = str(value)
    if "####" in value:
      return value.rsplit("####", 1)[1].strip()
    extracted = extract_math_answer(value, True) if fallback_last_number else last_boxed(value)
    return extracted if extracted is not None else value.strip()
  raise KeyError(f"math reward needs `answer`, `ground_truth` or `solution`; got keys {sorted(example)}")


def math_reward(prompt: str, completion: str, *, fallback_last_number: bool = False, **example) -> float:
  del prompt
  reference = reference_answer(example, fallback_last_number)
  predicted = extract_math_answer(completion, fallback_last_number)
  return float(predicted is not None and math_equal(predicted, reference))


register("math")(math_reward)
register("math_last_number")(functools.partial(math_reward, fallback_last_number=True))
