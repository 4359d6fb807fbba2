"""Seeded multi-step arithmetic word problems with worked R1-style solutions (a toy RLVR task).

A problem is a start count and 1..5 operations (add, subtract, multiply, divide exactly), e.g.
  "Mia has 12 apples. Then Mia gets 5 more apples. Then Mia gives away 3 apples. How many apples
   does Mia have now?"  answer 14,
  solution "<think>\nStep 1: 12 + 5 = 17\nStep 2: 17 - 3 = 14\n</think><answer>14</answer>".
Train / held-out split is a function of the problem's mathematical content alone: its key is
(start value, operations and operands in order), hashed; the person's name, the item and the wording
are not part of it. So a held-out problem never shares its start, operations, answer or worked solution
with any training problem, whatever the seeds, and "distinct problems" means distinct content (two
problems that differ only in name or item are the same problem). All intermediate values are integers
in [0, 1000].
Phrasing `template`: "default" (above) or "box", a second wording of the same problem for
out-of-distribution tests ("A box holds 12 apples. Mia puts 5 more apples into the box. ... How many
apples are in the box at the end?"); the template is not part of the key, so a problem and its
rewording share split, answer and solution.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from typing import Sequence, Union

import numpy as np

NAMES = ("Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Lena", "Ravi", "Sara", "Tom", "Yuki", "Ines")
ITEMS = ("apples", "marbles", "stickers", "coins", "books", "pencils", "cookies", "stamps")
SPLITS = ("train", "test")
HELD_OUT_PERCENT = 20  # share of the problem space assigned to the "test" split
MAX_VALUE = 1000
_SENTENCE = {"+": "Then {n} gets {x} more {i}.", "-": "Then {n} gives away {x} {i}.",
             "*": "Then {n} ends up with {x} times as many {i}.",
             "/": "Then {n} splits the {i} into {x} equal groups and keeps one group."}
_BOX_SENTENCE = {"+": "{n} puts {x} more {i} into the box.", "-": "{n} takes {x} {i} out of the box.",
                 "*": "The number of {i} in the box becomes {x} times as large.",
                 "/": "{n} shares the {i} in the box equally among {x} friends and leaves one share in the box."}
TEMPLATES = ("default", "box")


def phrase(template: str, name: str, item: str, start: int, ops: Sequence[tuple[str, int]]) -> str:
  """The question text of one problem in the wording `template` (an entry of TEMPLATES)."""
  if template == "default":
    sentences = " ".join(_SENTENCE[op].format(n=name, x=x, i=item) for op, x in ops)
    return f"{name} has {start} {item}. {sentences} How many {item} does {name} have now?"
  if template == "box":
    sentences = " ".join(_BOX_SENTENCE[op].format(n=name, x=x, i=item) for op, x in ops)
    return f"A box holds {start} {item}. {sentences} How many {item} are in the box at the end?"
  raise ValueError(f"template must be one of {TEMPLATES}, got {template!r}")


@dataclasses.dataclass(frozen=True)
class Problem:
  """question text, integer answer, worked solution, number of steps, split, and key: the content key
  (`content_key`) that decides the split and makes problems distinct."""
  question: str
  answer: int
  solution: str
  num_steps: int
  split: str
  key: str


def apply_op(value: int, op: str, x: int) -> int:
  """One exact integer step: value op x (division must be exact)."""
  if op == "+":
    return value + x
  if op == "-":
    return value - x
  if op == "*":
    return value * x
  if op == "/":
    if x == 0 or value % x:
      raise ValueError(f"{value} / {x} is not an exact division")
    return value // x
  raise ValueError(f"unknown operation {op!r}")


def solve(start: int, ops: Sequence[tuple[str, int]]) -> tuple[int, str]:
  """(answer, "<think>Step 1: a op b = c ... </think><answer>N</answer>") by applying ops in order."""
  value, lines = int(start), []
  for s, (op, x) in enumerate(ops, 1):
    new = apply_op(value, op, x)
    lines.append(f"Step {s}: {value} {op} {x} = {new}")
    value = new
  return value, "<think>\n" + "\n".join(lines) + f"\n</think><answer>{value}</answer>"


def content_key(start: int, ops: Sequence[tuple[str, int]]) -> str:
  """The canonical key of a problem's mathematical content: JSON [start, [[op, operand], ...]]."""
  return json.dumps([int(start), [[op, int(x)] for op, x in ops]])


def split_of(key: str) -> str:
  """'test' for HELD_OUT_PERCENT of keys (by SHA-256), else 'train'."""
  h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
  return "test" if h % 100 < HELD_OUT_PERCENT else "train"


def _random_ops(rng: np.random.Generator, start: int, num_steps: int,
                max_addend: int = 30) -> list[tuple[str, int]]:
  ops, value = [], start
  for _ in range(num_steps):
    choices = (["+"] if value < MAX_VALUE else []) + (["-"] if value > 1 else []) + (["*"] if value * 2 <= MAX_VALUE else [])
    divisors = [d for d in range(2, 10) if value % d == 0 and value > d]
    choices += ["/"] if divisors else []
    op = choices[rng.integers(len(choices))]
    if op == "+":
      x = int(rng.integers(1, min(max_addend, MAX_VALUE - value) + 1))
    elif op == "-":
      x = int(rng.integers(1, value))
    elif op == "*":
      x = int(rng.integers(2, min(4, MAX_VALUE // value) + 1))
    else:
      x = int(divisors[rng.integers(len(divisors))])
    ops.append((op, x))
    value = apply_op(value, op, x)
  return ops


def make_problem(name: str, item: str, start: int, ops: Sequence[tuple[str, int]],
                 template: str = "default") -> Problem:
  """The Problem for one start count and op list (question in `template`'s wording, solved answer and
  solution, split)."""
  question = phrase(template, name, item, start, ops)
  answer, solution = solve(start, ops)
  key = content_key(start, ops)
  return Problem(question, answer, solution, len(ops), split_of(key), key)


def generate_problems(n: int, split: str = "train", num_steps: Union[int, tuple[int, int]] = (1, 5),
                      seed: int = 0, max_start: int = 50, max_addend: int = 30,
                      template: str = "default") -> list[Problem]:
  """n problems of `split` with distinct content (`content_key`), deterministic in (n, split, num_steps,
  seed, max_start, max_addend); the first n of a longer list are the same problems. `template` only
  changes the wording: the same arguments give the same problems in every template.

  num_steps: an int in 1..5, or an inclusive range (lo, hi) drawn uniformly per problem.
  max_start: the start count is drawn from [2, max_start]; max_addend: "gets x more" draws x from
  [1, max_addend] (subtraction, multiplication by 2..4 and exact division follow the running value).
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  lo, hi = (num_steps, num_steps) if isinstance(num_steps, int) else tuple(num_steps)
  if not 1 <= lo <= hi <= 5:
    raise ValueError(f"num_steps must lie in 1..5, got {num_steps!r}")
  if template not in TEMPLATES:
    raise ValueError(f"template must be one of {TEMPLATES}, got {template!r}")
  if not (2 <= max_start <= MAX_VALUE and 1 <= max_addend <= MAX_VALUE):
    raise ValueError(f"need 2 <= max_start <= {MAX_VALUE} and 1 <= max_addend <= {MAX_VALUE}, "
                     f"got max_start={max_start}, max_addend={max_addend}")
  rng = np.random.default_rng([seed, lo, hi, SPLITS.index(split)])
  out, seen = [], set()
  for _ in range(200 * n + 1000):
    if len(out) == n:
      break
    start = int(rng.integers(2, max_start + 1))
    ops = _random_ops(rng, start, int(rng.integers(lo, hi + 1)), max_addend)
    p = make_problem(NAMES[rng.integers(len(NAMES))], ITEMS[rng.integers(len(ITEMS))], start, ops, template)
    if p.split == split and p.key not in seen:
      seen.add(p.key)
      out.append(p)
  if len(out) < n:
    raise RuntimeError(f"could only find {len(out)} {split} problems of distinct content with num_steps={num_steps}, "
                       f"max_start={max_start}, max_addend={max_addend}: ask for fewer, or allow more operations "
                       f"or larger numbers")
  return out


def write_traces(path, problems: Sequence[Problem], data_source: str = "fineflax/arith") -> pathlib.Path:
  """Write problems with their solver solutions as LUFFY-format JSONL (atomic)."""
  from fineflax.rl.traces import write_luffy_jsonl
  return write_luffy_jsonl(path, [(p.question, p.solution, p.answer, {"split": p.split,
                                                                      "num_steps": p.num_steps})
                                  for p in problems], data_source)
