"""Math answer rewards graded with math-verify, as LUFFY's released reward does.

LUFFY (`luffy/verl/verl/mix_src/math_verify_reward.py`, `labeling_responses`):

  correct(text, gt) = verify(parse("$" + gt + "$"), parse(text))      (math-verify's default settings:
                      LaTeX + plain-expression extraction, float_rounding 6, 5 s timeouts)

Registered rewards (1.0 or 0.0):
  math_think        LUFFY `reward_impl_version=3` (their training reward): the completion must hold
                    "</think>" (LUFFY prepends "<think>\\n" to every response, so only the closing tag is
                    checked), else 0; the text graded is `completion.split("</think>")[1]` (from the first
                    closing tag to the next one, if any), as in their `RewardMathFn`.
  math              LUFFY `reward_impl_version=4` (`reward_fn_math_verify_no_think`): correct(completion, gt).
  math_last_number  the toy tasks' reward: the last complete \\boxed{} / \\fbox{} (nested boxes unwrapped), else
                    the last <answer>...</answer>, else the last number; graded as correct("$" + it + "$", gt),
                    with gt extracted from the reference the same way (a reference sentence "90 + 23 =
                    113." gives 113; a reference with no number is used whole).
The reference gt is the example's `answer`, `ground_truth` or `solution` (`reference_answer`: GSM8K's
"... #### 72" gives 72, a MATH solution its last \\boxed{} content).

math-verify's timeouts use SIGALRM, which only the main thread may set: off the main thread (e.g.
`score_completions(max_workers > 1)`) grading runs in a small worker-process pool where they still apply.
"""
from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import re
import threading

from fineflax.rewards.qa import extract_answer
from fineflax.rewards.registry import register

THINK_END = "</think>"
TIMEOUT_S = 5  # math-verify's parse and per-comparison timeouts (its defaults, as LUFFY runs it)
POOL_WORKERS = 2
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_LAST_NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?|[+-]?\.\d+")
_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _verify_here(text: str, ground_truth: str, timeout_s: int) -> bool:
  from math_verify import parse, verify
  gold = parse("$" + ground_truth + "$", parsing_timeout=timeout_s)
  return bool(verify(gold, parse(text, parsing_timeout=timeout_s), timeout_seconds=timeout_s))


def _worker_pool() -> concurrent.futures.ProcessPoolExecutor:
  global _pool
  with _pool_lock:
    if _pool is None:
      _pool = concurrent.futures.ProcessPoolExecutor(POOL_WORKERS, mp_context=multiprocessing.get_context("spawn"))
  return _pool


def math_verify_correct(text: str, ground_truth: str) -> bool:
  """LUFFY's `labeling_responses([text], ground_truth)[0]`: math-verify's verdict on the answer in `text`
  against the reference `ground_truth` (bare LaTeX, wrapped in $...$)."""
  if threading.current_thread() is threading.main_thread():
    return _verify_here(text, ground_truth, TIMEOUT_S)
  # worker processes run math-verify on their main thread; a stuck one is bounded by its own timeouts
  return _worker_pool().submit(_verify_here, text, ground_truth, TIMEOUT_S).result(timeout=20 * TIMEOUT_S + 60)


def math_equal(pred: str, ref: str) -> bool:
  """Whether the bare answer `pred` is equivalent to the reference `ref` (math-verify, as above)."""
  return bool(pred.strip()) and math_verify_correct("$" + pred + "$", ref)


def after_think(completion: str) -> str | None:
  """The text LUFFY grades: between the first "</think>" and the next (or the end); None without one."""
  parts = completion.split(THINK_END)
  return parts[1] if len(parts) > 1 else None


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
  """The content of the last complete top-level \\boxed{} (nested boxes unwrapped), or None."""
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


def math_reward(prompt: str, completion: str, *, think_gate: bool = False, **example) -> float:
  """LUFFY's reward version 3 (think_gate=True) or 4 (False); see the module docstring."""
  del prompt
  reference = reference_answer(example)
  text = after_think(completion) if think_gate else completion
  return float(text is not None and math_verify_correct(text, reference))


def math_last_number_reward(prompt: str, completion: str, **example) -> float:
  del prompt
  predicted = extract_math_answer(completion, fallback_last_number=True)
  return float(predicted is not None and math_equal(predicted, reference_answer(example, fallback_last_number=True)))


register("math")(math_reward)
register("math_think")(functools.partial(math_reward, think_gate=True))
register("math_last_number")(math_last_number_reward)
