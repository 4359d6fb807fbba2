"""LUFFY's Table at toy scale (issue 16, item 1): on-policy RL, SFT, SFT+RL, LUFFY and LUFFY without
policy shaping on 2-3 operation word problems, S seeds each, on every visible GPU (experiments/compare.py).

  python -m experiments.luffy.run --model /root/models/SmolLM2-135M-Instruct.Q4_1.gguf --out DIR \\
      --seeds 0 1 2 3 --per-gpu 2 --time-budget 560 --set model.remat=full model.logits_chunk=32
  python -m experiments.luffy.run --smoke --model TINY_HF_FOLDER --out /tmp/luffy     # CPU, seconds

Methods (configs/luffy_arith.py presets): rl (DAPO loss, T=0.7, truncated rows masked), sft (SFT on the
solver's worked solutions, the traces LUFFY uses), sft_rl (50 SFT steps, then the same RL for --steps),
luffy (official train.sh settings), luffy_noshape. Every RL phase samples the same rollouts per step
(prompts_per_step x group_size rows; LUFFY's include 1 trace per group); sft_rl runs 50 + --steps steps so
that its RL phase has the same rollout budget. Writes into --out: RESULTS.md (compare.py's tables per
evaluation step, then the final-evaluation table: in-distribution, 4-5 operations, second wording;
greedy accuracy and pass@8), results.json (compare.py's, plus the final evaluations; every figure is
drawn from it), curves.png (accuracy), pass_at_k.png, entropy.png, length.png, train_entropy.png. A call stopped by --time-budget is resumed by running the same command.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys


from configs.luffy_arith import SFT_RL_SFT_STEPS
from experiments import compare
from fineflax.io import atomic_write_text
from experiments.common import add_runner_args, command_line, plot_curves, runner_argv
from fineflax.runs import add_output_args, mean_ci95, output_folder_or_exit, results_series, seed_evaluations

CONFIG = "configs/luffy_arith.py"
METHODS = {"rl": "", "sft": "sft", "sft_rl": "sft_rl", "luffy": "luffy", "luffy_noshape": "luffy_noshape"}
SETS = (("", "in-distribution (2-3 ops)"), ("ood_ops_", "4-5 ops"), ("ood_phrasing_", "second wording"))
EXTRA = ("eval_pass_at_8", "eval_ood_ops_accuracy", "eval_ood_ops_pass_at_8", "eval_ood_phrasing_accuracy",
         "eval_ood_phrasing_pass_at_8", "eval_sample_entropy", "eval_completion_length", "eval_sample_length")
# file -> (metric, label, where results.json keeps it: "evals" = evaluation records, "train" = every step)
PLOTS = {"pass_at_k.png": ("eval_pass_at_8", "pass@k, held-out (T=0.7)", "evals"),
         "entropy.png": ("eval_sample_entropy", "entropy per token of T=0.7 samples (held-out)", "evals"),
         "length.png": ("eval_completion_length", "greedy completion length (tokens)", "evals"),
         "train_entropy.png": ("entropy", "policy entropy in the RL loss (training rows)", "train")}


def total_steps(name: str, steps: int) -> int:
  """num_steps of a method's run: `steps` RL (or SFT) steps; sft_rl first runs its SFT steps."""
  return steps + (SFT_RL_SFT_STEPS if name == "sft_rl" else 0)


def method_specs(methods, steps: int, smoke: bool, pass_k: int) -> list[str]:
  """compare.py --method values: NAME=PRESETS[,smoke][;num_steps=...] (sft_rl gets 50 extra SFT steps)."""
  specs = []
  for name in methods:
    presets = ",".join(p for p in (METHODS[name], "smoke" if smoke else "") if p)
    if smoke:  # one step each (sft_rl: one SFT step, then one RL step)
      over = [f"num_steps={2 if name == 'sft_rl' else 1}"]
    else:
      over = [f"num_steps={total_steps(name, steps)}"] if name == "sft_rl" else []
    over += [f"task.pass_k={pass_k}"] if pass_k != 8 else []
    specs.append(";".join([f"{name}={presets}", *over]))
  return specs


def final_table(runs_dir: pathlib.Path, methods, seeds, k: int, final_steps: dict | None = None
                ) -> tuple[str, dict]:
  """Markdown: per method, each metric at the evaluation of step final_steps[method] (default: each seed's
  last evaluation), mean ± 95% CI over the seeds that reached it; seeds cut short are named."""
  cols = [(f"eval_{p}accuracy", f"{label} acc") for p, label in SETS]
  cols += [(f"eval_{p}pass_at_{k}", f"{label} pass@{k}") for p, label in SETS]
  cols += [("eval_sample_entropy", "sample entropy"), ("eval_completion_length", "greedy length")]
  lines = ["| method | steps | " + " | ".join(c[1] for c in cols) + " |", "|---|---|" + "---|" * len(cols)]
  finals = {}
  for name in methods:
    per_seed = seed_evaluations(runs_dir, name, seeds, "eval_accuracy")
    want = (final_steps or {}).get(name)
    last = [e for evals in per_seed for e in evals[-1:] if want is None or e["step"] == want]
    if not last:
      continue
    finals[name] = last
    cells = []
    for key, _ in cols:
      vals = [h[key] for h in last if key in h]
      m, ci = mean_ci95(vals) if vals else (float("nan"), float("nan"))
      cells.append("-" if not vals else f"{m:.3f} ± {ci:.3f}" if len(vals) > 1 else f"{m:.3f}")
    short = len(per_seed) - len(last)
    steps = f"{last[0]['step']} (n={len(last)}{f'; {short} cut short' if short else ''})" if want else \
        ", ".join(str(h["step"]) for h in last)
    lines.append(f"| {name} | {steps} | " + " | ".join(cells) + " |")
  return "\n".join(lines), finals


def plots(results: dict, out: pathlib.Path, methods, k: int) -> list[str]:
  """The entropy, length and pass@k curves (mean and 95% band over seeds) from results.json (compare.py's:
  evaluation records and per-step training metrics); returns the files written."""
  written = []
  for fname, (metric, label, source) in PLOTS.items():
    metric = metric.replace("pass_at_8", f"pass_at_{k}")
    series = {n: s for n in methods if (s := results_series(results, n, metric, source))}
    if series:
      plot_curves(series, label, str(out / fname), title=label, xlabel="step (sft_rl: 50 SFT steps first)")
      written.append(fname)
  return written


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="", help="model source (default: the config's)")
  add_output_args(ap, "luffy")
  ap.add_argument("--steps", type=int, default=150, help="RL steps (rollout batches) of every method")
  ap.add_argument("--eval-every", type=int, default=30)
  ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
  ap.add_argument("--split", default="test", choices=("test", "validation"),
                  help="held-out split evaluated: validation to tune, test to report")
  ap.add_argument("--pass-k", type=int, default=8)
  ap.add_argument("--set", nargs="*", default=[], help="config overrides for every run, key=value")
  ap.add_argument("--smoke", action="store_true", help="the configs' smoke preset: 2 steps, tiny sets")
  add_runner_args(ap, per_gpu=2)
  args = ap.parse_args(argv)
  out = pathlib.Path(output_folder_or_exit(args.out, args.overwrite))
  common = [*([f"model.source={args.model}"] if args.model else []), f"task.eval_split={args.split}"]
  common += ["eval_at_start=False"] if args.smoke else [f"num_steps={args.steps}", f"eval_every={args.eval_every}"]
  k = 2 if args.smoke else args.pass_k
  cargv = ["--config", CONFIG, "--out", str(out), *(["--overwrite"] if args.overwrite else []), *runner_argv(args),
           "--title", f"LUFFY five-way, {args.split} split" + (" (SMOKE RUN, not a result)" if args.smoke else ""),
           "--extra-metrics", *[m.replace("pass_at_8", f"pass_at_{k}") for m in EXTRA], "--set", *common, *args.set]
  for spec in method_specs(args.methods, args.steps, args.smoke, args.pass_k if not args.smoke else 8):
    cargv += ["--method", spec]
  code = compare.main(cargv)
  final_steps = None if args.smoke else \
      {m: total_steps(m, args.steps) for m in args.methods}
  table, finals = final_table(out / "runs", args.methods, args.seeds, k, final_steps)
  res = json.loads((out / "results.json").read_text())
  figs = plots(res, out, args.methods, k)
  md = (out / "RESULTS.md").read_text()
  md += (f"\n### Final evaluation ({args.split} split; step {args.steps} of RL; mean ± 95% CI)\n\n"
         f"command: `{command_line()}`\n\n{table}\n\n" + "\n".join(f"![{f}]({f})" for f in figs) + "\n")
  atomic_write_text(out / "RESULTS.md", md)
  res["final"] = {n: [{k_: v for k_, v in h.items() if k_.startswith("eval_") or k_ == "step"} for h in hs]
                  for n, hs in finals.items()}
  res["luffy_command"] = command_line()
  atomic_write_text(out / "results.json", json.dumps(res, indent=1))
  print(table)
  return code


if __name__ == "__main__":
  sys.exit(main())
