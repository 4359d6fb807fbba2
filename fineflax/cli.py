"""The one-line user errors of the command-line entry points (launch.py, `python -m fineflax.inspect_data`).

A user's mistake (a bad config value or file, a missing optional package, a workdir that is a file, a
changed config over old checkpoints, a bad data file, a missing model) prints `error: <one line>` on stderr
and exits 2; `--verbose` in argv shows the traceback instead. Anything else is a bug and keeps its traceback.
SIGINT (Ctrl-C) outside the training loop (which saves and exits 130 itself), e.g. while the model loads,
prints one line and exits 130 (128 + SIGINT, as a shell reports it); `--verbose` shows the traceback.
Python drops a KeyboardInterrupt raised inside a garbage-collector callback or a `__del__` (JAX runs one at
every collection: "Exception ignored in _xla_gc_callback"), so `sigint_until_caught` raises it again.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
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


RETRY_S = 0.05  # a dropped KeyboardInterrupt is raised again this many seconds later


@contextlib.contextmanager
def sigint_until_caught():
  """While inside (main thread only): SIGINT raises KeyboardInterrupt, and one that Python had to drop (raised
  inside a garbage-collector callback or a `__del__`: it reaches `sys.unraisablehook`, which would print
  "Exception ignored in ..." and a traceback) is sent again, silently, to land in ordinary code. Other
  unraisable exceptions go to the previous hook."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  inside = threading.Event()

  def resend():
    if inside.is_set():
      os.kill(os.getpid(), signal.SIGINT)

  def hook(unraisable):
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
      threading.Timer(RETRY_S, resend).start()  # another thread, after the hook returned: raised in ordinary code
    else:
      old_hook(unraisable)

  old_handler, old_hook = signal.signal(signal.SIGINT, signal.default_int_handler), sys.unraisablehook
  sys.unraisablehook = hook
  inside.set()
  try:
    yield
  finally:
    inside.clear()
    signal.signal(signal.SIGINT, old_handler)
    sys.unraisablehook = old_hook


def run_cli(main: Callable[[Sequence[str]], int | None], argv: Sequence[str]) -> int:
  """main(argv)'s exit code (None: 0), 2 after printing a user error as one line, or 130 after a one-line
  note when SIGINT interrupts it (module doc)."""
  try:
    with sigint_until_caught():
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
