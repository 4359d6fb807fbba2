"""The one-line user errors of the command-line entry points (launch.py, `python -m fineflax.inspect_data`).

A user's mistake (a bad config value or file, a missing optional package, a workdir that is a file, a
changed config over old checkpoints, a bad data file, a missing model) prints `error: <one line>` on stderr
and exits 2; `--verbose` in argv shows the traceback instead. Anything else is a bug and keeps its traceback.
SIGINT (Ctrl-C) outside the training loop (which saves and exits 130 itself), e.g. while the model loads,
prints one line and exits 130 (128 + SIGINT, as a shell reports it); `--verbose` shows the traceback.
"""
from __future__ import annotations

import sys
from typing import Callable, Sequence


def user_errors() -> tuple:
  """Exceptions that are the user's mistake (one line, exit 2), not a bug."""
  from fineflax.config_checks import ConfigError
  from fineflax.data.sources import DataError
  from fineflax.rl.traces import TraceFormatError
  from fineflax.train.checkpoint import CheckpointUnreadable
  from fineflax.train.run_config import ConfigChanged, WorkdirError
  from memory.sop import SOPError
  from memory.store import StoreError
  return (ConfigError, ConfigChanged, CheckpointUnreadable, WorkdirError, DataError, TraceFormatError, StoreError, SOPError,
          FileNotFoundError)


INTERRUPTED = 130  # 128 + SIGINT


def run_cli(main: Callable[[Sequence[str]], int | None], argv: Sequence[str]) -> int:
  """main(argv)'s exit code (None: 0), 2 after printing a user error as one line, or 130 after a one-line
  note when SIGINT interrupts it (module doc)."""
  try:
    return int(main(argv) or 0)
  except KeyboardInterrupt:
    if "--verbose" in argv:
      raise
    print("interrupted (SIGINT) before the training loop ran or after it ended: nothing more was saved",
          file=sys.stderr, flush=True)
    return INTERRUPTED
  except user_errors() as e:
    if "--verbose" in argv:
      raise
    print(f"error: {e}", file=sys.stderr)
    return 2
