"""XLA backend compiles of this process, counted from `jax.monitoring`'s backend-compile event.

    counter = CompileCounter()        # counts from now
    ...; counter.count, counter.seconds
    totals()                          # (compiles, seconds) since the listener was installed

The listener is registered once per process (`install`, on first use); it sees every backend compile (jit
dispatch, `.lower().compile()`, any thread). A program loaded from the persistent compilation cache is not
a backend compile and is not counted.
"""
from __future__ import annotations

import threading

_LOCK = threading.Lock()
_TOTALS = [0, 0.0]  # compiles, seconds
_INSTALLED = False


def _event(name: str, seconds: float, **_) -> None:
  from jax._src import dispatch
  if name == dispatch.BACKEND_COMPILE_EVENT:
    with _LOCK:
      _TOTALS[0] += 1
      _TOTALS[1] += float(seconds)


def install() -> None:
  """Registers the listener (once per process)."""
  global _INSTALLED
  with _LOCK:
    if _INSTALLED:
      return
    _INSTALLED = True
  import jax
  jax.monitoring.register_event_duration_secs_listener(_event)


def totals() -> tuple[int, float]:
  """(backend compiles, their seconds) since `install` (installs it on first call)."""
  install()
  with _LOCK:
    return _TOTALS[0], _TOTALS[1]


class CompileCounter:
  """Backend compiles (count, seconds) since it was made or last `start`ed."""

  def __init__(self):
    self.start()

  def start(self) -> "CompileCounter":
    self._base = totals()
    return self

  @property
  def count(self) -> int:
    return totals()[0] - self._base[0]

  @property
  def seconds(self) -> float:
    return totals()[1] - self._base[1]
