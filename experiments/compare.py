"""M methods x S seeds of one config, placed on all visible GPUs: one table (mean ± 95% CI per evaluation
step), one plot, every run's history.

  python -m experiments.compare --config configs/grpo_arith.py --out experiments/exgrpo \\
      --method grpo=grpo --method exgrpo=grpo,exgrpo --seeds 0 1 2 3 --set num_steps=60 --per-gpu 2

A method is NAME=PRESETS[;key=value;...]: the config's presets and its own overrides (after the common
--set ones). Each run is `python launch.py --config CONFIG:PRESETS --workdir OUT/runs/NAME-SEED ...` in its
own process (`fineflax.runs.run_parallel`: --per-gpu runs per GPU, or --parallel on a CPU; --in-process:
one after another in this process); a run that crashes is reported and the others go on. --time-budget S
stops every run (SIGTERM: it saves a checkpoint) S seconds after the start; the same command resumes them.
Writes RESULTS.md, results.json and curves.png into --out. `--collect` only tabulates the runs already there.

results.json: the command, device, config, seeds, methods; per method and seed the run's status, every
evaluation record ("evals": the training metrics of that step too) and, under "train", every step's
value of the --train-metrics it logged ({"step": [...], metric: [...]}); and "no_model_baselines" per
seed: the environment's answers without a model (`no_model_baselines` of fineflax/envs: constant answer,
Search-R1's prior), scored by the same evaluation code on the same held-out items as the runs.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time


from fineflax.io import atomic_write_text
from experiments.common import command_line, device_name
from fineflax.runs import (NOT_STARTED, launch_argv, load_history, mean_ci95, output_folder_or_exit, plot_curves,
                           run_parallel, summary_table)


def parse_method(spec: str) -> tuple[str, str, list[str]]:
  """"name=presets;k=v;k=v" -> (name, presets, ["k=v", ...])."""
  name, _, rest = spec.partition("=")
  presets, *overrides = rest.split(";") if rest else [""]
  if not name:
    raise SystemExit(f"--method {spec!r}: expected NAME=PRESETS[;key=value...]")
  return name, presets, [o for o in overrides if o]


def run_in_process(spec: str, workdir: str, overrides: list[str]) -> int:
  """One run in this interpreter (as launch.py would run it); an exception is printed and exits 1."""
  import traceback
  from fineflax import jobs
  from fineflax.jobs.resolve import load_config
  try:
    out = jobs.run(load_config(spec, overrides), workdir)
    return int(out.get("exit_code", 0)) if isinstance(out, dict) else 0
  except Exception:  # noqa: BLE001  (reported like a crashed subprocess; the other runs go on)
    traceback.print_exc()
    return 1


TRAIN_METRICS = ("entropy", "reward_mean", "solve_rate", "completion_length", "zero_variance_groups", "loss",
                 "sft_loss", "off_policy_prob", "replay_share", "buffer_questions", "buffer_retired", "searches")


def train_series(hist: list[dict], metrics) -> dict[str, list]:
  """{"step": [...], metric: [...]} over the steps that logged any of `metrics` (None where one is absent);
  only the metrics logged at least once."""
  rows = [h for h in hist if h.get("step", 0) > 0 and any(m in h for m in metrics)]
  present = [m for m in metrics if any(m in h for h in rows)]
  return {"step": [h["step"] for h in rows], **{m: [h.get(m) for h in rows] for m in present}}


def no_model_baselines(spec: str, overrides: list[str], seeds) -> dict:
  """{seed: env.no_model_baselines()} for an RL config whose environment has them (else {})."""
  from fineflax.envs import get_env_class
  from fineflax.jobs.resolve import load_config
  out = {}
  for seed in seeds:
    config = load_config(spec, [f"seed={seed}", *overrides])
    env_cls = get_env_class(config.env) if config.get("job") == "rl" and "env" in config else None
    if env_cls is None or not hasattr(env_cls, "no_model_baselines"):
      return {}
    out[str(seed)] = env_cls(config, None).no_model_baselines()
  return out


def baseline_table(baselines: dict, metrics) -> str:
  """Markdown: each no-model baseline's metrics, mean ± 95% CI over seeds (mean_ci95)."""
  names = sorted({n for b in baselines.values() for n in b})
  lines = ["| baseline | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
  for n in names:
    cells = []
    for m in metrics:
      vals = [b[n][m] for b in baselines.values() if m in b.get(n, {})]
      mean, ci = mean_ci95(vals) if vals else (float("nan"), float("nan"))
      cells.append("-" if not vals else f"{mean:.3f} ± {ci:.3f}" if len(vals) > 1 else f"{mean:.3f}")
    lines.append(f"| {n} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def visible_gpus() -> list[int]:
  if shutil.which("nvidia-smi") is None:
    return []
  out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
  ids = [i for i, line in enumerate(out.splitlines()) if line.startswith("GPU")]
  env = os.environ.get("CUDA_VISIBLE_DEVICES")
  return [int(x) for x in env.split(",") if x.strip()] if env else ids


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--config", required=True, help="config file (its presets go in --method)")
  ap.add_argument("--method", action="append", required=True, help="NAME=PRESETS[;key=value...]")
  ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
  ap.add_argument("--set", nargs="*", default=[], help="overrides for every run, key=value")
  ap.add_argument("--metric", default="eval_accuracy", help="evaluation metric of the table and plot")
  ap.add_argument("--extra-metrics", nargs="*", default=[], help="more metrics tabulated per step")
  ap.add_argument("--train-metrics", nargs="*", default=list(TRAIN_METRICS),
                  help="training metrics kept for every step in results.json (those a run logs)")
  ap.add_argument("--out", required=True, help="output folder (e.g. under runs/)")
  ap.add_argument("--overwrite", action="store_true", help="allow an --out that holds files tracked by git")
  ap.add_argument("--per-gpu", type=int, default=1, help="runs sharing one GPU")
  ap.add_argument("--parallel", type=int, default=2, help="runs at once without GPUs")
  ap.add_argument("--collect", action="store_true", help="only tabulate the runs already in --out")
  ap.add_argument("--in-process", action="store_true",
                  help="run the runs one after another in this process (CPU smoke tests: no start-up per run)")
  ap.add_argument("--run-timeout", type=int, default=0,
                  help="seconds after which each run gets SIGTERM (it saves, and reports the steps it ran)")
  ap.add_argument("--time-budget", type=int, default=0,
                  help="seconds for all runs together: each run is stopped (SIGTERM, checkpoint saved) by then "
                       "and runs with under a minute left are not started; call again to resume them")
  ap.add_argument("--title", default="")
  ap.add_argument("--device", default="", help="the device the runs ran on (with --collect elsewhere; "
                                                "default: this machine's)")
  args = ap.parse_args(argv)
  methods = [parse_method(m) for m in args.method]
  out = pathlib.Path(output_folder_or_exit(args.out, args.overwrite))
  (out / "runs").mkdir(parents=True, exist_ok=True)
  t0, codes = time.time(), {}
  gpus = visible_gpus()
  if not args.collect:
    # seed-major order: a call cut short by --time-budget leaves every method with the same seeds done
    runs_ = {f"{name}-{seed}": (f"{args.config}:{presets}" if presets else args.config,
                                str(out / "runs" / f"{name}-{seed}"), [f"seed={seed}", *args.set, *over])
             for seed in args.seeds for name, presets, over in methods}
    if args.in_process:
      codes = {name: run_in_process(*spec) for name, spec in runs_.items()}
    else:
      limit = ["timeout", "-s", "TERM", str(args.run_timeout)] if args.run_timeout else []
      commands = {name: limit + launch_argv(*spec) for name, spec in runs_.items()}
      codes = run_parallel(commands, str(out / "logs"), max_parallel=args.parallel, gpus=gpus or None,
                           per_gpu=args.per_gpu, deadline=t0 + args.time_budget if args.time_budget else None)
  histories, runs = {}, {}
  for name, _, _ in methods:
    for seed in args.seeds:
      try:
        hist, finished = load_history(str(out / "runs" / f"{name}-{seed}"))
      except FileNotFoundError:
        print(f"{name}-{seed}: no history (exit {codes.get(f'{name}-{seed}')}, see logs/{name}-{seed}.log)")
        continue
      histories.setdefault(name, []).append(hist)
      runs.setdefault(name, {})[seed] = {"finished": finished, "exit": codes.get(f"{name}-{seed}"),
                                         "steps_run": hist[-1]["step"] if hist else 0,
                                         "evals": [h for h in hist if args.metric in h],
                                         "train": train_series(hist, args.train_metrics)}
  wall = time.time() - t0
  device = args.device or device_name()
  series = {n: [([h["step"] for h in hist if args.metric in h], [h[args.metric] for h in hist if args.metric in h])
                for hist in hs] for n, hs in histories.items()}
  series = {n: [r for r in rs if r[0]] for n, rs in series.items() if any(r[0] for r in rs)}
  if series:
    plot_curves(series, args.metric, str(out / "curves.png"), title=args.title or f"{args.config} ({device})")
  eval_steps = {h["step"] for hs in histories.values() for hist in hs for h in hist if args.metric in h}
  tables = [f"### {args.metric}\n\n{summary_table(histories, args.metric)}"]
  tables += [f"### {m} (at the evaluation steps)\n\n{summary_table(histories, m, eval_steps)}"
             for m in args.extra_metrics]
  for name, seeds in runs.items():  # every tabulated metric at the evaluation steps, per seed
    for seed, hist in zip(seeds, histories[name]):
      seeds[seed]["at_evals"] = [{k: h[k] for k in ("step", args.metric, *args.extra_metrics) if k in h}
                                 for h in hist if h["step"] in eval_steps]
  _, presets0, over0 = methods[0]  # the methods of one comparison share the task and its held-out items
  baselines = no_model_baselines(f"{args.config}:{presets0}" if presets0 else args.config, [*args.set, *over0],
                                 args.seeds)
  if baselines:
    base_metrics = sorted({m for b in baselines.values() for v in b.values() for m in v if m.startswith("eval_")})
    tables.insert(0, f"### Baselines without a model (same held-out items and scoring)\n\n"
                     f"{baseline_table(baselines, base_metrics)}")
  atomic_write_text(out / "results.json", json.dumps({"command": command_line(), "device": device, "wall_s": wall,
                                                "config": args.config, "seeds": args.seeds,
                                                "methods": {n: {"presets": p, "overrides": o} for n, p, o in methods},
                                                "common": args.set, "runs": runs,
                                                "no_model_baselines": baselines}, indent=1))
  failed = [f"{n} (exit {c})" for n, c in codes.items() if c not in (0, NOT_STARTED)]
  not_started = [n for n, c in codes.items() if c == NOT_STARTED]
  steps_run = "; ".join(f"{n}: " + ", ".join(str(r["steps_run"]) for r in rs.values()) for n, rs in runs.items())
  placement = ("one run at a time in one process" if args.in_process else
               f"{args.per_gpu} runs at once per GPU" if gpus else f"{args.parallel} runs at once")
  md = f"""## {args.title or 'Comparison'} ({time.strftime('%Y-%m-%d')})

- command: `{command_line()}`
- device: {device}; {f'{len(gpus) or "no"} GPUs, {placement}; wall time {wall:.0f} s' if not args.collect else
                     'tabulated with --collect from the runs already in --out'}
- methods: {'; '.join(f'{n} = `{args.config}:{p}` {" ".join(o)}' for n, p, o in methods)}; common overrides:
  `{' '.join(args.set)}`; seeds {args.seeds}
- cells: mean ± 95% confidence interval (Student t) over seeds, n = runs that reached the step
- steps run per seed: {steps_run}
{f'- runs that did not finish: {failed} (their logged evaluations are included)' if failed else ''}
{f'- runs not started in this call (time budget): {not_started}' if not_started else ''}

{chr(10).join(tables)}

![curves](curves.png)
"""
  atomic_write_text(out / "RESULTS.md", md)
  print(md)
  return 0 if histories else 1


if __name__ == "__main__":
  sys.exit(main())
