"""Several GRPO-family settings side by side on one GPU: held-out (validation) accuracy curves and a table.

  python -m experiments.grpo_arith.sweep --model /path/SmolLM2-135M-Instruct.Q4_1.gguf --out DIR \\
      --variants grpo dapo drgrpo --set num_steps=80 --parallel 6

Each variant is `experiments/grpo_arith/run.py` with the common `--set` overrides and then its own
(VARIANTS below), run as its own process (at most --parallel at once). Evaluations use
`task.eval_split=validation`: the next held-out problems of the test set's own generator, which share no
problem (no mathematical content) with the test set that the final run reports, so choosing a setting here
does not touch the reported test problems. (An earlier version used another seed, eval_seed=20000, whose
problems overlapped the test set's in 4 of 256.)
Writes sweep.md, sweep.json and accuracy_curves.png into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time


from experiments.common import ROOT, command_line, device_name, load_history, plot_curves, run_parallel
from fineflax.io import atomic_write_text
from fineflax.runs import add_output_args, output_folder_or_exit

SMALL = {"task.max_start": "20", "task.max_addend": "10"}
R1 = {"task.assistant_prefix": "<think>\n", "task.system_prompt":
      "Think step by step inside <think> </think>, then give the final number inside <answer> </answer>."}
T07 = {"rl.temperature": "0.7", "optimizer.learning_rate": "5e-4"}
# name -> (presets of configs/grpo_arith.py, overrides applied after the common --set ones); the presets
# spell out the loss settings (configs/common.py), so a variant means the same whatever the defaults are
VARIANTS = {
    "grpo_T1": ("grpo", {**SMALL, "rl.temperature": "1.0", "optimizer.learning_rate": "2e-4"}),
    "grpo": ("grpo", {**SMALL, **T07}),
    "drgrpo": ("grpo,dr_grpo", {**SMALL, **T07, "rl.mask_truncated": "true"}),
    "dapo": ("dapo", {**SMALL, **T07}),
    "dapo_lr1e-3": ("dapo", {**SMALL, **T07, "optimizer.learning_rate": "1e-3"}),
    "dapo_T1": ("dapo", {**SMALL, "rl.temperature": "1.0", "optimizer.learning_rate": "5e-4"}),
    "dapo_think": ("dapo", {**SMALL, **R1, **T07}),
    "luffy_think": ("grpo,luffy", {**SMALL, **R1, **T07}),
}


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="smollm2-135m-instruct")
  add_output_args(ap, "grpo_arith_sweep")
  ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
  ap.add_argument("--set", nargs="*", default=[], help="overrides for every variant, a.b=value")
  ap.add_argument("--parallel", type=int, default=4, help="runs sharing the device at once")
  ap.add_argument("--smoke", action="store_true", help="CPU smoke variant of the config")
  args = ap.parse_args()
  output_folder_or_exit(args.out, args.overwrite)
  common = {"task.eval_split": "validation", **dict(s.partition("=")[::2] for s in args.set)}
  commands = {}
  for name in args.variants:
    presets, own = VARIANTS[name]
    over = {**common, **own}
    commands[name] = [sys.executable, "-m", "experiments.grpo_arith.run", "--model", args.model, "--out", os.path.join(args.out, name),
                      *(["--overwrite"] if args.overwrite else []),
                      "--presets", presets, *(["--smoke"] if args.smoke else []),
                      "--set", *[f"{k}={v}" for k, v in over.items()]]
  t0 = time.time()
  codes = run_parallel(commands, os.path.join(args.out, "logs"), args.parallel, cwd=str(ROOT))
  results, rows = {}, []
  for name in args.variants:
    try:  # a run that failed or was stopped still reports the evaluations it logged
      hist, _ = load_history(os.path.join(args.out, name, "run"))
    except FileNotFoundError:
      rows.append(f"| {name} | failed (exit {codes[name]}, see logs/{name}.log) | | | | |")
      continue
    results[name] = hist
    if not any("eval_accuracy" in h for h in hist[1:]):
      rows.append(f"| {name} | stopped before its first evaluation (exit {codes[name]}) | | | | |")
      continue
    evals = [h for h in hist if "eval_accuracy" in h]
    train = [h for h in hist if "reward_mean" in h][-10:]
    mean = lambda k: sum(h[k] for h in train) / max(len(train), 1)
    rows.append(f"| {name} | {evals[0]['eval_accuracy']:.3f} -> {evals[-1]['eval_accuracy']:.3f} | "
                f"{max(h['eval_accuracy'] for h in evals):.3f} | {mean('reward_mean'):.3f} | "
                f"{mean('completion_length'):.0f} | {hist[-1]['time_s']:.0f} |")
  json.dump({"variants": {n: VARIANTS[n] for n in args.variants}, "common": common, "results": results},
            open(os.path.join(args.out, "sweep.json"), "w"))
  plot_curves({n: [([h["step"] for h in r if "eval_accuracy" in h], [h["eval_accuracy"] for h in r
                                                                     if "eval_accuracy" in h])]
               for n, r in results.items()}, "validation accuracy (greedy)",
              os.path.join(args.out, "accuracy_curves.png"), title=f"GRPO settings ({device_name()})")
  md = f"""## GRPO settings sweep ({time.strftime('%Y-%m-%d')})

- command: `{command_line()}`
- device: {device_name()}, {args.parallel} runs at once; total wall {time.time() - t0:.0f} s
- common overrides: `{common}`; per-variant overrides in sweep.json

| variant | validation accuracy (start -> end) | best | train reward (last 10 steps) | completion length (last 10) | run wall s |
|---|---|---|---|---|---|
{chr(10).join(rows)}

![validation accuracy](accuracy_curves.png)
"""
  atomic_write_text(pathlib.Path(args.out, "sweep.md"), md)
  print(md)


if __name__ == "__main__":
  main()
