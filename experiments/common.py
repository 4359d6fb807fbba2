"""Shared pieces of the experiment scripts: loading a config file, device name, curves, RESULTS.md."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

from benchmarks._gpu import device_name  # noqa: F401  (re-exported for the experiment scripts)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_config(path: str, variant: str = ""):
  """get_config(variant) of a config file (as launch.py's `--config path:variant`)."""
  spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, ROOT / path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant) if variant else module.get_config()


def apply_overrides(config, overrides: dict) -> None:
  """Sets dotted keys ("rl.group_size") of a ConfigDict; string values take the existing field's type."""
  for key, value in overrides.items():
    node, *path = key.split(".")
    parent = config
    for p in [node, *path][:-1]:
      parent = parent[p]
    leaf = [node, *path][-1]
    old = parent[leaf]
    if isinstance(value, str) and not isinstance(old, str):
      value = value.lower() in ("1", "true") if isinstance(old, bool) else type(old)(value)
    parent[leaf] = value


def command_line() -> str:
  return "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])


def plot_curves(series: dict[str, list[tuple[list, list]]], ylabel: str, path: str, title: str = "") -> None:
  """One line per name: the mean over its runs (x, y), with a min-max band when there are several."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 3.8))
  for name, runs in series.items():
    x = np.asarray(runs[0][0], float)
    ys = np.asarray([np.interp(x, np.asarray(r[0], float), np.asarray(r[1], float)) for r in runs])
    ax.plot(x, ys.mean(0), label=f"{name} (n={len(runs)})", marker="o" if len(x) <= 12 else None)
    if len(runs) > 1:
      ax.fill_between(x, ys.min(0), ys.max(0), alpha=0.2)
  ax.set_xlabel("RL step")
  ax.set_ylabel(ylabel)
  if title:
    ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def run_parallel(commands: dict[str, list[str]], log_dir: str, max_parallel: int = 4) -> dict[str, int]:
  """Runs each named command (argv) as a subprocess, at most `max_parallel` at once (small models
  leave a GPU mostly idle, so several runs share it); stdout+stderr go to LOG_DIR/<name>.log.

  Returns {name: exit code}; the runs' own outputs are theirs to write.
  """
  os.makedirs(log_dir, exist_ok=True)
  pending, running, codes = list(commands.items()), {}, {}
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  while pending or running:
    while pending and len(running) < max_parallel:
      name, argv = pending.pop(0)
      log = open(os.path.join(log_dir, f"{name}.log"), "w")
      running[name] = (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT), log)
      print(f"started {name}: {' '.join(argv)}", flush=True)
    for name, (proc, log) in list(running.items()):
      if proc.poll() is not None:
        log.close()
        codes[name] = proc.returncode
        del running[name]
        print(f"finished {name} (exit {proc.returncode})", flush=True)
    time.sleep(1.0)
  return codes


def load_history(workdir: str) -> tuple[list[dict], bool]:
  """(history, finished) of one run: WORKDIR/history.json, or for a run stopped before writing it, the
  per-step metrics it logged (WORKDIR/logs/metrics.jsonl) with finished=False."""
  path = os.path.join(workdir, "history.json")
  if os.path.exists(path):
    return json.load(open(path)), True
  log = os.path.join(workdir, "logs", "metrics.jsonl")
  if not os.path.exists(log):
    raise FileNotFoundError(f"{workdir}: the run left neither history.json nor logs/metrics.jsonl")
  return [json.loads(line) for line in open(log) if line.strip()], False
