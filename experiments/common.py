"""Shared pieces of the experiment scripts: the command line, the device name, and the library's config
loader (ml-collections' override parsing, as launch.py) and run helpers (`fineflax.runs`)."""
from __future__ import annotations

import os
import pathlib
import sys

from benchmarks._gpu import device_name  # noqa: F401  (re-exported for the experiment scripts)
from fineflax.jobs.resolve import load_config  # noqa: F401
from fineflax.runs import launch_argv, load_history, plot_curves, run_parallel, summary_table  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parents[1]


def command_line() -> str:
  return "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
