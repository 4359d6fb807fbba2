"""GRPO vs LUFFY vs ExGRPO at the same rollout budget on multi-step arithmetic, several seeds.

  python experiments/luffy/run.py --model /path/SmolLM2-135M-Instruct.Q4_1.gguf --out DIR     # GPU
  python experiments/luffy/run.py --smoke --out /tmp/luffy                                     # CPU

Every method samples `group_size` rows per question (LUFFY: one of them is the solver's worked trace;
ExGRPO: one is a replayed own success once replay is on) on problems with 2-3 operations and numbers
up to 20, where the base model rarely succeeds. Writes accuracy_curves.png, results.json and RESULTS.md
into --out.
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

from experiments.common import (command_line, device_name, load_config, load_history,  # noqa: E402
                                plot_curves, run_parallel)

METHODS = ("grpo", "luffy", "exgrpo")


def make_config(args, method, seed):
  # R1-style: the assistant turn opens with "<think>\n" (prefilled), as the solver traces do;
  # the GRPO-paper loss for every method (the 2026-11-26 runs), not the config's DAPO defaults
  over = [f"model.source={args.model}", f"seed={seed}", "task.num_steps=(2, 3)", "task.max_start=20",
          "task.max_addend=10", "task.assistant_prefix=<think>\n", "rl.temperature=0.7",
          "optimizer.learning_rate=5e-4",
          "task.system_prompt=Think step by step inside <think> </think>, then give the final number inside "
          "<answer> </answer>."]
  over += {"grpo": [], "luffy": ["rl.clip=true", "rl.agg_mode=seq-mean-token-mean",
                                 "rl.advantage_scale=group", "rl.entropy_coef=0.0"],
           "exgrpo": ["rl.exgrpo.threshold=0.0"]}[method]  # 0.35 is never reached here
  if not args.smoke:
    over += [f"num_steps={args.steps}", f"eval_every={max(args.steps // 4, 1)}", "rl.prompts_per_step=16",
             "task.num_eval=128", "rl.max_new_tokens=192"]
  presets = ",".join(["grpo", method if method != "grpo" else "", "smoke" if args.smoke else ""])
  return load_config(f"configs/grpo_arith.py:{presets}", [*over, *args.set])


def child_args(args) -> list[str]:
  """The options a single-run child process needs to rebuild the same config."""
  return ["--model", args.model, "--out", args.out, "--steps", str(args.steps),
          *(["--smoke"] if args.smoke else []), *(["--set", *args.set] if args.set else [])]


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="smollm2-135m-instruct")
  ap.add_argument("--out", default="experiments/luffy/out")
  ap.add_argument("--steps", type=int, default=24)
  ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
  ap.add_argument("--methods", nargs="*", default=list(METHODS))
  ap.add_argument("--smoke", action="store_true")
  ap.add_argument("--set", nargs="*", default=[], help="config overrides a.b=value for every run")
  ap.add_argument("--parallel", type=int, default=1, help="runs sharing the device at once (subprocesses)")
  ap.add_argument("--only", nargs=2, metavar=("METHOD", "SEED"), help="run one method and seed in-process")
  ap.add_argument("--collect", action="store_true", help="only tabulate the runs already in --out")
  ap.add_argument("--device", default="", help="device name for the report (default: this machine's)")
  args = ap.parse_args()
  os.makedirs(args.out, exist_ok=True)
  if args.only:
    from fineflax.jobs import rl
    method, seed = args.only[0], int(args.only[1])
    rl.run(make_config(args, method, seed), os.path.join(args.out, f"{method}-{seed}"))
    return
  if not args.collect:
    commands = {f"{m}-{s}": [sys.executable, str(pathlib.Path(__file__).resolve()), *child_args(args),
                             "--only", m, str(s)] for m in args.methods for s in args.seeds}
    codes = run_parallel(commands, os.path.join(args.out, "logs"), args.parallel)
    failed = [name for name, code in codes.items() if code != 0]
    if failed:
      print(f"runs that did not finish: {failed} (their logged evaluations are still reported)", flush=True)
  results = {m: [load_run(args.out, m, s) for s in args.seeds] for m in args.methods}
  json.dump(results, open(os.path.join(args.out, "results.json"), "w"))
  device = args.device or device_name()
  evals = lambda r: [(h["step"], h["eval_accuracy"]) for h in r["history"] if "eval_accuracy" in h]
  steps = sorted({st for runs in results.values() for r in runs for st, _ in evals(r)})
  series = {m: [tuple(map(list, zip(*evals(r)))) for r in runs] for m, runs in results.items()}
  num_ops = "-".join(map(str, make_config(args, "grpo", 0).task.num_steps))
  plot_curves(series, "held-out accuracy (greedy)", os.path.join(args.out, "accuracy_curves.png"),
              title=f"SmolLM2-135M QLoRA, {num_ops}-step arithmetic ({device})")
  lines = []
  for m, runs in results.items():
    cells = []
    for st in steps:
      acc = np.array([a for r in runs for s_, a in evals(r) if s_ == st])
      cells.append(f"{acc.mean():.3f} ± {acc.std():.3f} (n={len(acc)})" if len(acc) else "-")
    reached = ", ".join(str(r["steps_run"]) for r in runs)
    lines.append(f"| {m} | {' | '.join(cells)} | {reached} |")
  c0 = make_config(args, "grpo", 0)
  md = f"""## GRPO vs LUFFY vs ExGRPO ({time.strftime('%Y-%m-%d')})

- command: `{command_line()}`
- device: {device}, {args.parallel} runs at once
- same rollout budget per step for every method: {c0.rl.prompts_per_step} questions x {c0.rl.group_size} rows;
  seeds {args.seeds}; held-out accuracy = greedy, {c0.task.num_eval} problems, mean ± std over seeds

| method | {' | '.join(f'step {st}' for st in steps)} | steps run (per seed) |
|---|{'---|' * len(steps)}---|
{chr(10).join(lines)}

![accuracy curves](accuracy_curves.png)
"""
  pathlib.Path(args.out, "RESULTS.md").write_text(md)
  print(md)


def load_run(out: str, method: str, seed: int) -> dict:
  """{seed, history, steps_run, finished} of one run (`load_history`: stopped runs report what they logged)."""
  try:
    hist, finished = load_history(os.path.join(out, f"{method}-{seed}"))
  except FileNotFoundError as e:
    raise FileNotFoundError(f"run {method} seed {seed}: {e}; see {out}/logs/{method}-{seed}.log") from e
  return {"seed": seed, "history": hist, "steps_run": hist[-1]["step"], "finished": finished}


if __name__ == "__main__":
  main()
