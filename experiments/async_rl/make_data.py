"""The one-step addition task of experiments/async_rl/config.py: "What is a + b?" for a, b in 1..25.

  python -m experiments.async_rl.make_data     # rewrites data/add_train.jsonl and data/add_eval.jsonl

The split is by the unordered pair {a, b}: a held-out question never has its operands (in either order) in a
training question. Unordered pairs are shuffled with a fixed seed and given to the held-out set until it
holds EVAL_ROWS ordered questions (a + b and b + a; a + a once); the rest are the training set.
Rows: {"question": "What is 5 + 19?", "answer": "24"} (JSONL, read by fineflax.envs.dataset, format custom).
"""
from __future__ import annotations

import json
import pathlib
import random

HERE = pathlib.Path(__file__).resolve().parent
LO, HI = 1, 25
EVAL_ROWS = 192
SEED = 47


def rows(pairs) -> list[dict]:
  out = []
  for a, b in pairs:
    for x, y in dict.fromkeys([(a, b), (b, a)]):
      out.append({"question": f"What is {x} + {y}?", "answer": str(x + y)})
  return out


def split() -> tuple[list[dict], list[dict]]:
  pairs = [(a, b) for a in range(LO, HI + 1) for b in range(a, HI + 1)]
  random.Random(SEED).shuffle(pairs)
  held, n = [], 0
  while n < EVAL_ROWS:
    held.append(pairs.pop())
    n += 1 if held[-1][0] == held[-1][1] else 2
  return rows(pairs), rows(held)[:EVAL_ROWS]


def main() -> int:
  train, held = split()
  (HERE / "data").mkdir(exist_ok=True)
  for name, data in (("add_train.jsonl", train), ("add_eval.jsonl", held)):
    (HERE / "data" / name).write_text("".join(json.dumps(r) + "\n" for r in data))
    print(f"{HERE / 'data' / name}: {len(data)} rows")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
