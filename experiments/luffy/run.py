"""GRPO vs LUFFY vs ExGRPO at the same rollout budget on multi-step arithmetic, several seeds.

  python experiments/luffy/run.py --model /path/SmolLM2-135M-Instruct.Q4_1.gguf --out DIR     # GPU
  python experiments/luffy/run.py --smoke --out /tmp/luffy                                     # CPU

Every method samples `group_size` rows per question (LUFFY: one of them is the solver's worked trace;
ExGRPO: one is a replayed own success once replay is on) on problems with 2-4 operations, where the
base model rarely succeeds. Writes accuracy_curves.png, results.json and RESULTS.md into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from experiments.common import command_line, device_name, load_config, plot_curves  # noqa: E402

METHODS = ("grpo", "luffy", "exgrpo")


def make_config(args, method, seed):
  c = load_config("configs/grpo_arith.py", "smoke" if args.smoke else "")
  c.model.source = args.model
  c.seed = seed
  c.rl.objective = method
  c.rl.n_off = 1
  c.task.num_steps = (2, 4)
  if not args.smoke:
    c.num_steps = args.steps
    c.eval_every = max(args.steps // 4, 1)
    c.rl.prompts_per_step = 16
    c.task.num_eval = 128
    c.rl.max_new_tokens = 192
  return c


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="smollm2-135m-instruct")
  ap.add_argument("--out", default="experiments/luffy/out")
  ap.add_argument("--steps", type=int, default=24)
  ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
  ap.add_argument("--methods", nargs="*", default=list(METHODS))
  ap.add_argument("--smoke", action="store_true")
  args = ap.parse_args()
  import jax
  jax.config.update("jax_compilation_cache_dir", os.path.join(args.out, "jax_cache"))
  from fineflax.jobs import grpo
  os.makedirs(args.out, exist_ok=True)
  results, t0 = {}, time.time()
  for method in args.methods:
    for seed in args.seeds:
      c = make_config(args, method, seed)
      ts = time.time()
      hist = grpo.run(c, os.path.join(args.out, f"{method}-{seed}"))["history"]
      results.setdefault(method, []).append({"seed": seed, "history": hist, "wall_s": time.time() - ts})
      json.dump(results, open(os.path.join(args.out, "results.json"), "w"))
      print(f"{method} seed {seed}: final accuracy {hist[-1].get('eval_accuracy')}", flush=True)
  series = {m: [([h["step"] for h in r["history"] if "eval_accuracy" in h],
                 [h["eval_accuracy"] for h in r["history"] if "eval_accuracy" in h]) for r in runs]
            for m, runs in results.items()}
  plot_curves(series, "held-out accuracy (greedy)", os.path.join(args.out, "accuracy_curves.png"),
              title=f"SmolLM2-135M QLoRA, 2-4 step arithmetic ({device_name()})")
  lines = []
  for m, runs in results.items():
    first = np.array([r["history"][0]["eval_accuracy"] for r in runs])
    final = np.array([r["history"][-1]["eval_accuracy"] for r in runs])
    best = np.array([max(h["eval_accuracy"] for h in r["history"] if "eval_accuracy" in h) for r in runs])
    lines.append(f"| {m} | {len(runs)} | {first.mean():.3f} | {final.mean():.3f} ± {final.std():.3f} | "
                 f"{best.mean():.3f} ± {best.std():.3f} | {np.mean([r['wall_s'] for r in runs]):.0f} |")
  md = f"""## GRPO vs LUFFY vs ExGRPO ({time.strftime('%Y-%m-%d')})

- command: `{command_line()}`
- device: {device_name()}; total wall time {time.time() - t0:.0f} s
- same rollout budget per step for every method: {make_config(args, 'grpo', 0).rl.prompts_per_step} questions x
  {make_config(args, 'grpo', 0).rl.group_size} rows; seeds {args.seeds}

| method | seeds | accuracy at step 0 | final accuracy (mean ± std) | best accuracy | wall s / run |
|---|---|---|---|---|---|
{chr(10).join(lines)}

![accuracy curves](accuracy_curves.png)
"""
  pathlib.Path(args.out, "RESULTS.md").write_text(md)
  print(md)


if __name__ == "__main__":
  main()
