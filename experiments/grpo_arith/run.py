"""GRPO on generated arithmetic word problems: held-out accuracy before and after, reward curve.

  python -m experiments.grpo_arith.run --model /path/SmolLM2-135M-Instruct.Q4_1.gguf --out DIR   # GPU
  python -m experiments.grpo_arith.run --smoke --out /tmp/grpo_arith                             # CPU

Runs `fineflax.jobs.rl` with configs/grpo_arith.py[:--presets] (any `--set key=value` overrides), then writes
history.json, reward_curve.png and RESULTS.md (command, device, wall time, table) into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import time


from experiments.common import command_line, device_name, load_config, plot_curves
from fineflax.io import atomic_write_text
from fineflax.runs import add_output_args, output_folder_or_exit


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="smollm2-135m-instruct", help="model source (alias, folder or .gguf)")
  add_output_args(ap, "grpo_arith")
  ap.add_argument("--smoke", action="store_true", help="CPU smoke variant of the config")
  ap.add_argument("--presets", default="", help="config presets, e.g. dapo or luffy")
  ap.add_argument("--set", nargs="*", default=[], help="config overrides a.b=value")
  args = ap.parse_args()
  output_folder_or_exit(args.out, args.overwrite)
  from fineflax.jobs import rl
  presets = ",".join(p for p in (args.presets, "smoke" if args.smoke else "") if p)
  config = load_config(f"configs/grpo_arith.py:{presets}", [f"model.source={args.model}", *args.set])
  os.makedirs(args.out, exist_ok=True)
  t0 = time.time()
  result = rl.run(config, os.path.join(args.out, "run"))
  wall = time.time() - t0
  hist = result["history"]
  json.dump(hist, open(os.path.join(args.out, "history.json"), "w"), indent=1)
  train = [h for h in hist if "reward_mean" in h]
  evals = [h for h in hist if "eval_accuracy" in h]
  plot_curves({"train reward (sampled)": [([h["step"] for h in train], [h["reward_mean"] for h in train])],
               "held-out accuracy (greedy)": [([h["step"] for h in evals], [h["eval_accuracy"] for h in evals])]},
              "reward / accuracy", os.path.join(args.out, "reward_curve.png"),
              title=f"GRPO, SmolLM2-135M-Instruct QLoRA ({device_name()})")
  before, after = evals[0]["eval_accuracy"], evals[-1]["eval_accuracy"]
  rows = "\n".join(f"| {h['step']} | {h['time_s']:.0f} | {h['eval_accuracy']:.3f} | "
                   f"{h.get('reward_mean', float('nan')):.3f} | {h.get('completion_length', h.get('eval_completion_length', 0)):.0f} |"
                   for h in evals)
  md = f"""## GRPO on arithmetic word problems ({time.strftime('%Y-%m-%d')})

- command: `{command_line()}`
- device: {device_name()}; wall time {wall:.0f} s (model load, compilation and evaluations included)
- model: SmolLM2-135M-Instruct, NF4 base + LoRA r={config.lora.r}; {hist[-1]['step']} of {config.num_steps} steps x
  {config.rl.prompts_per_step} questions x {config.rl.group_size} samples; held-out set: {config.task.num_eval}
  problems ({tuple(config.task.num_steps)} operations), disjoint from training.
- held-out accuracy (greedy): **{before:.3f} -> {after:.3f}** ({(after - before) * 100:+.1f} points,
  x{after / max(before, 1e-9):.2f})

| step | time (s) | held-out accuracy | train reward | completion length |
|---|---|---|---|---|
{rows}

![reward curve](reward_curve.png)
"""
  atomic_write_text(pathlib.Path(args.out, "RESULTS.md"), md)
  print(md)


if __name__ == "__main__":
  main()
