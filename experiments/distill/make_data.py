"""Writes the arithmetic task (fineflax.rl.tasks, grpo_arith sizes) as chat data for the distillation demo.

  python experiments/distill/make_data.py --out experiments/distill/data

train_messages.jsonl: system + question + a worked answer ("Step 1: 12 + 5 = 17 ... The answer is 14.") for
training the teacher's adapter (an SFT stand-in for the GRPO adapter, see RESULTS.md); questions.jsonl: the
same train questions alone (prompts the teacher answers for distillation); eval.jsonl: held-out questions
with their answers (test split, seed 10000, as the GRPO job's evaluation).
"""
from __future__ import annotations

import argparse
import json
import os

from fineflax.io import atomic_write_text
from fineflax.rl.tasks import generate_problems

SYSTEM = "Solve the word problem step by step. End with the final number, like: The answer is 42."
SIZES = dict(num_steps=(1, 2), max_start=20, max_addend=10)


def worked(solution: str, answer: int) -> str:
  steps = solution.split("<think>\n", 1)[1].split("\n</think>", 1)[0]
  return f"{steps}\nThe answer is {answer}."


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="experiments/distill/data")
  ap.add_argument("--num-train", type=int, default=2000)
  ap.add_argument("--num-eval", type=int, default=128)
  args = ap.parse_args(argv)
  train = generate_problems(args.num_train, "train", seed=0, **SIZES)
  held_out = generate_problems(args.num_eval, "test", seed=10_000, **SIZES)
  dump = lambda rows: "".join(json.dumps(r) + "\n" for r in rows)
  atomic_write_text(os.path.join(args.out, "train_messages.jsonl"), dump(
      {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p.question},
                    {"role": "assistant", "content": worked(p.solution, p.answer)}]} for p in train))
  atomic_write_text(os.path.join(args.out, "questions.jsonl"), dump(
      {"question": p.question, "answer": str(p.answer)} for p in train))
  atomic_write_text(os.path.join(args.out, "eval.jsonl"), dump(
      {"question": p.question, "answer": str(p.answer)} for p in held_out))
  print(f"{len(train)} train, {len(held_out)} held-out problems -> {args.out}")


if __name__ == "__main__":
  main()
