"""Agent rollouts: wall time of N calculator-agent rollouts run by 1 thread (each LLM call its own `generate`)
vs N threads (concurrent calls: rows of one continuously batched engine, `fineflax.agents.LocalLLM`), each after two warm-up runs (compilation).

  python -m benchmarks.agents --model smollm2-135m-instruct --rollouts 32 --out DIR     # GPU
  python -m benchmarks.agents --model /path/tiny --rollouts 8 --max-tokens 8 --out DIR  # CPU
Writes DIR/agents.json and prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

from fineflax.io import atomic_write_json


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="smollm2-135m-instruct")
  ap.add_argument("--rollouts", type=int, default=32)
  ap.add_argument("--max-tokens", type=int, default=48)
  ap.add_argument("--max-calls", type=int, default=3)
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--out", default="/tmp/bench_agents")
  args = ap.parse_args()
  import jax
  import jax.numpy as jnp
  from benchmarks.gpu import device_name
  from fineflax.agents import LocalLLM, Store, run_rollouts
  from fineflax.agents.calculator import CalculatorAgent, calculator_tasks
  from fineflax.envs.word_problems import generate_problems
  from fineflax.models import load
  from fineflax.rl.policy import Policy
  dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[args.dtype]
  params, mc, tok = load(args.model, dtype=dtype)
  policy = Policy(params, mc, tok, None, 1.0, dtype, temperature=0.7, max_new_tokens=args.max_tokens)
  tasks = calculator_tasks(generate_problems(args.rollouts, "train", (2, 3), 0, max_start=20, max_addend=10))
  agent = CalculatorAgent(args.max_calls)
  rows = {}
  for workers in (1, args.rollouts):
    for phase in ("warm-up", "warm-up 2", "timed"):  # two warm-ups: thread timing varies the batch shapes
      llm = LocalLLM(policy, jax.random.key(0), max_rows=args.rollouts)
      t0 = time.time()
      recs = run_rollouts(agent, tasks, llm, {}, Store(), num_workers=workers)
      wall = time.time() - t0
      llm.close()
      calls = sum(s.kind == "llm" for r in recs for s in r.spans)
      rows[f"{workers} {phase}"] = {"workers": workers, "wall_s": wall, "llm_calls": calls,
                                     "decode_calls": len(llm.batch_sizes),
                                     "mean_batch": sum(llm.batch_sizes) / max(len(llm.batch_sizes), 1)}
  os.makedirs(args.out, exist_ok=True)
  res = {"device": device_name(), "command": "python " + " ".join(sys.argv), "rows": rows}
  atomic_write_json(pathlib.Path(args.out, "agents.json"), res, indent=1)
  print(f"device: {res['device']}\n\n| threads | wall (s) | LLM calls | decode calls | mean rows |\n|---|---|---|---|---|")
  for k, r in rows.items():
    if k.endswith("timed"):
      print(f"| {r['workers']} | {r['wall_s']:.1f} | {r['llm_calls']} | {r['decode_calls']} | {r['mean_batch']:.1f} |")


if __name__ == "__main__":
  main()
