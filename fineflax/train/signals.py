"""SIGINT/SIGTERM -> a flag the training loop polls, so it can save and exit cleanly."""
from __future__ import annotations

import signal
import threading


class StopRequested:
  """Context manager installing handlers; `bool(self)` is True once a signal arrived."""

  def __init__(self, signals=(signal.SIGINT, signal.SIGTERM)):
    self._signals, self._event, self._old, self.signal_name = signals, threading.Event(), {}, None

  def _handle(self, signum, frame):
    self.signal_name = signal.Signals(signum).name
    if self._event.is_set():  # second signal: give up on the clean exit
      raise KeyboardInterrupt
    self._event.set()

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for s in self._signals:
        self._old[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc):
    for s, h in self._old.items():
      signal.signal(s, h)
    return False

  def __bool__(self):
    return self._event.is_set()
