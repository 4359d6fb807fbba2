"""Many runs of one experiment: processes side by side on the visible GPUs, their histories, a table with
95% confidence intervals and curves with bands; and an experiment's output folder (`add_output_args`,
`output_folder`): runs/experiments/NAME by default, and a folder holding committed files only with --overwrite.

  codes = run_parallel({"luffy-0": argv, ...}, log_dir, gpus=[0, 1, 2, 3], per_gpu=1)
  histories = {"luffy": [load_history(workdir)[0] for workdir in ...], ...}
  table = summary_table(histories, "eval_accuracy")        # Markdown, mean ± 95% CI per evaluation step

A run that crashes is reported by its exit code and log; the others go on.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Sequence

import numpy as np

from fineflax.stats import t_interval
from fineflax.io import read_json

NOT_STARTED = -1  # exit code reported for a run that the time budget left no time to start


def run_parallel(commands: dict[str, list[str]], log_dir: str, max_parallel: int = 4,
                 gpus: Sequence[int] | None = None, per_gpu: int = 1, cwd: str | None = None,
                 deadline: float | None = None, min_run_s: float = 60.0) -> dict[str, int]:
  """Runs each named command (argv) as a subprocess; stdout+stderr go to LOG_DIR/<name>.log.

  gpus: device ids to place runs on, `per_gpu` runs per device at once (CUDA_VISIBLE_DEVICES, and a
  memory fraction of 1/per_gpu each), filling every device once before any gets a second run; without
  gpus at most `max_parallel` run at once.
  deadline: a time.time() by which every run must end: each starts under `timeout -s TERM` for the
  seconds left (the loop saves a checkpoint on SIGTERM, so a later call resumes it), and a run with
  less than `min_run_s` left is not started (exit code NOT_STARTED).
  Returns {name: exit code}; a crashed run does not stop the others.
  """
  os.makedirs(log_dir, exist_ok=True)
  slots = [str(g) for _ in range(per_gpu) for g in gpus] if gpus else [None] * max_parallel
  pending, running, codes = list(commands.items()), {}, {}
  free = list(range(len(slots)))
  while pending or running:
    while pending and free:
      if deadline is not None and deadline - time.time() < min_run_s:
        for name, _ in pending:
          codes[name] = NOT_STARTED
          print(f"not started {name}: under {min_run_s:.0f} s of the time budget left", flush=True)
        pending = []
        break
      slot = free.pop(0)
      name, argv = pending.pop(0)
      if deadline is not None:
        argv = ["timeout", "-s", "TERM", str(int(deadline - time.time())), *argv]
      env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
      if slots[slot] is not None:
        env.update(CUDA_VISIBLE_DEVICES=slots[slot], XLA_PYTHON_CLIENT_MEM_FRACTION=f"{0.9 / per_gpu:.2f}")
      log = open(os.path.join(log_dir, f"{name}.log"), "w")
      proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
      running[name] = (proc, log, slot)
      print(f"started {name}" + (f" on GPU {slots[slot]}" if slots[slot] else "") + f": {' '.join(argv)}",
            flush=True)
    for name, (proc, log, slot) in list(running.items()):
      if proc.poll() is not None:
        log.close()
        codes[name] = proc.returncode
        free.append(slot)
        del running[name]
        print(f"finished {name} (exit {proc.returncode})", flush=True)
    time.sleep(0.2)
  return codes


def launch_argv(config: str, workdir: str, overrides: Sequence[str] = ()) -> list[str]:
  """argv of `python launch.py --config CONFIG --workdir WORKDIR --config.k=v ...`."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return [sys.executable, os.path.join(root, "launch.py"), "--config", config, "--workdir", workdir,
          *[o if o.startswith("--") else f"--config.{o}" for o in overrides]]


def load_history(workdir: str) -> tuple[list[dict], bool]:
  """(history, finished) of one run: WORKDIR/history.json, or for a run stopped before writing it, the
  per-step metrics it logged (WORKDIR/logs/metrics.jsonl). finished: history.json exists and its last
  step reaches the run's num_steps (WORKDIR/config.json, where present; a run stopped by a signal writes
  history.json too)."""
  path = os.path.join(workdir, "history.json")
  if os.path.exists(path):
    hist = read_json(path)
    config = os.path.join(workdir, "config.json")
    num_steps = read_json(config).get("num_steps") if hist and os.path.exists(config) else None
    return hist, num_steps is None or hist[-1]["step"] >= num_steps
  log = os.path.join(workdir, "logs", "metrics.jsonl")
  if not os.path.exists(log):
    raise FileNotFoundError(f"{workdir}: the run left neither history.json nor logs/metrics.jsonl")
  with open(log) as f:
    return [json.loads(line) for line in f if line.strip()], False


def seed_evaluations(runs_dir, name: str, seeds, metric: str) -> list[list[dict]]:
  """Per seed with a run folder RUNS_DIR/NAME-SEED, the history records holding `metric` (its evaluations,
  in step order); seeds without a run or without an evaluation are left out."""
  out = []
  for seed in seeds:
    try:
      hist, _ = load_history(os.path.join(str(runs_dir), f"{name}-{seed}"))
    except FileNotFoundError:
      continue
    evals = [h for h in hist if metric in h]
    if evals:
      out.append(evals)
  return out


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
  """(mean, half-width of the 95% confidence interval of the mean: t_{0.975, n-1} · s / sqrt(n),
  `fineflax.stats.t_interval`); the half-width is nan for one value."""
  mean, _, high = t_interval(values)
  return mean, high - mean


def paired_test(a: dict, b: dict) -> dict:
  """Paired comparison of two methods' values keyed by seed (the seeds both have): n, the mean of the
  per-seed differences a - b, those differences, wins (seeds with a > b), the paired t-test p-value
  (two-sided; nan for n < 2 or no spread) and the exact sign-flip permutation p-value (two-sided: the
  share of the 2^n sign patterns whose |mean difference| >= the observed one; its smallest value is
  2 / 2^n, 0.125 at n = 4)."""
  from scipy import stats
  seeds = [s for s in a if s in b]
  d = np.array([float(a[s]) - float(b[s]) for s in seeds])
  n = len(d)
  out = {"n": n, "seeds": seeds, "diffs": d.tolist(), "diff": float(d.mean()) if n else float("nan"),
         "wins": int((d > 0).sum()), "losses": int((d < 0).sum())}
  if n == 0:
    return {**out, "t_p": float("nan"), "signflip_p": float("nan")}
  signs = np.array(np.meshgrid(*[[1.0, -1.0]] * n)).reshape(n, -1)  # every sign pattern, [n, 2^n]
  null = np.abs((signs * d[:, None]).mean(0))
  out["signflip_p"] = float((null >= abs(d.mean()) - 1e-12).mean())
  out["t_p"] = float(stats.ttest_rel(d, np.zeros(n)).pvalue) if n > 1 and d.std() > 0 else float("nan")
  return out


def results_series(results: dict, method: str, metric: str, source: str = "evals",
                   offset: int = 0) -> list[tuple[list, list]]:
  """Per seed of `method` in a compare.py results.json, (steps, values) of `metric`: from its evaluation
  records (source "evals") or its per-step training metrics ("train"); steps shifted by -offset; seeds
  without the metric are left out."""
  out = []
  for run in results.get("runs", {}).get(method, {}).values():
    if source == "evals":
      pts = [(e["step"], e[metric]) for e in run.get("evals", []) if e.get(metric) is not None]
    else:
      t = run.get("train", {})
      pts = [(s, v) for s, v in zip(t.get("step", []), t.get(metric, [])) if v is not None]
    if pts:
      out.append(([p[0] - offset for p in pts], [p[1] for p in pts]))
  return out


def metric_by_step(history: list[dict], metric: str) -> dict[int, float]:
  return {int(h["step"]): float(h[metric]) for h in history if metric in h}


def summary_table(histories: dict[str, list[list[dict]]], metric: str, steps=None) -> str:
  """Markdown table: one row per method, one column per step where `metric` was logged (only those in
  `steps` when given, e.g. the evaluation steps for a per-step metric): mean ± 95% CI (n runs)."""
  per = {m: [metric_by_step(h, metric) for h in hs] for m, hs in histories.items()}
  steps = sorted({s for runs in per.values() for r in runs for s in r if steps is None or s in steps})
  lines = [f"| method | {' | '.join(f'step {s}' for s in steps)} |", "|---|" + "---|" * len(steps)]
  for m, runs in per.items():
    cells = []
    for s in steps:
      vals = [r[s] for r in runs if s in r]
      if not vals:
        cells.append("-")
        continue
      mean, ci = mean_ci95(vals)
      cells.append(f"{mean:.3f} ± {ci:.3f} (n={len(vals)})" if len(vals) > 1 else f"{mean:.3f} (n=1)")
    lines.append(f"| {m} | {' | '.join(cells)} |")
  return "\n".join(lines)


def plot_curves(series: dict[str, list[tuple[list, list]]], ylabel: str, path: str, title: str = "",
                xlabel: str = "RL step") -> None:
  """One line per name: the mean over its runs (x, y), with a 95% CI band when there are several."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 3.8))
  for name, runs in series.items():
    x = np.asarray(runs[0][0], float)
    ys = np.asarray([np.interp(x, np.asarray(r[0], float), np.asarray(r[1], float)) for r in runs])
    ax.plot(x, ys.mean(0), label=f"{name} (n={len(runs)})", marker="o" if len(x) <= 12 else None)
    if len(runs) > 1:
      half = np.array([mean_ci95(ys[:, j])[1] for j in range(ys.shape[1])])
      ax.fill_between(x, ys.mean(0) - half, ys.mean(0) + half, alpha=0.2)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if title:
    ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


# ----------------------------------------------------------------------------- output folders of experiments

class TrackedOutput(ValueError):
  """An output folder holds files tracked by git: writing there would replace committed results."""


def tracked_files(folder) -> list[str]:
  """Files under `folder` that git tracks (paths relative to the repository); [] outside a repository or
  without git."""
  folder = os.path.abspath(folder)
  probe = folder
  while not os.path.isdir(probe):  # a folder not yet made: ask git in its nearest existing parent
    parent = os.path.dirname(probe)
    if parent == probe:
      return []
    probe = parent
  try:
    r = subprocess.run(["git", "-C", probe, "ls-files", "--full-name", "--", folder], capture_output=True,
                       text=True, timeout=60)
  except (OSError, subprocess.TimeoutExpired):
    return []
  return r.stdout.split() if r.returncode == 0 else []


def add_output_args(ap, name: str) -> None:
  """--out (default runs/experiments/NAME, gitignored) and --overwrite (let --out be a folder holding committed
  files, e.g. to refresh an experiment's committed results) on the argparse parser `ap`."""
  ap.add_argument("--out", default=os.path.join("runs", "experiments", name),
                  help=f"output folder (default runs/experiments/{name})")
  ap.add_argument("--overwrite", action="store_true",
                  help="allow an --out that holds files tracked by git (they are replaced)")


def output_folder(path, overwrite: bool, flag: str = "--out") -> str:
  """`path` after the check of `add_output_args`: TrackedOutput (one line) when it holds files tracked by git
  and `overwrite` is off. Call it before anything is written or loaded."""
  tracked = [] if overwrite else tracked_files(path)
  if tracked:
    raise TrackedOutput(f"{flag} {path}: holds {len(tracked)} file(s) tracked by git (e.g. {tracked[0]}) that "
                        f"this run would replace; pass --overwrite to replace them, or name another {flag}")
  return str(path)


def output_folder_or_exit(path, overwrite: bool, flag: str = "--out") -> str:
  """`output_folder`, or its one-line error on stderr and exit 2."""
  try:
    return output_folder(path, overwrite, flag)
  except TrackedOutput as e:
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(2) from None
