"""Shared pieces of the experiment scripts: the command line and device name (`benchmarks.gpu`), the library's config
loader (ml-collections' override parsing, as launch.py) and run helpers (`fineflax.runs`)."""
from __future__ import annotations

import pathlib

from benchmarks.gpu import command_line, device_name  # noqa: F401  (re-exported for the experiment scripts)
from fineflax.jobs.resolve import load_config  # noqa: F401
from fineflax.runs import launch_argv, load_history, plot_curves, run_parallel, summary_table  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parents[1]


def add_runner_args(ap, per_gpu: int) -> None:
  """The experiments/compare.py options an experiment script passes through (see `runner_argv`)."""
  ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
  ap.add_argument("--per-gpu", type=int, default=per_gpu, help="runs sharing one GPU")
  ap.add_argument("--parallel", type=int, default=2, help="runs at once without GPUs")
  ap.add_argument("--time-budget", type=int, default=0, help="seconds for this call's runs (compare.py)")
  ap.add_argument("--collect", action="store_true", help="only tabulate the runs already in --out")
  ap.add_argument("--device", default="", help="with --collect: the device the runs ran on")
  ap.add_argument("--in-process", action="store_true", help="runs one after another in this process (CPU)")


def runner_argv(args) -> list[str]:
  """compare.py's argv for the options of `add_runner_args`."""
  return ["--seeds", *map(str, args.seeds), "--per-gpu", str(args.per_gpu), "--parallel", str(args.parallel),
          *(["--time-budget", str(args.time_budget)] if args.time_budget else []),
          *(["--collect"] if args.collect else []), *(["--device", args.device] if args.device else []),
          *(["--in-process"] if args.in_process else [])]
