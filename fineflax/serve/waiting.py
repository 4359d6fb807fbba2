"""The server's waiting queue: a bound on the rows waiting for a decode slot, a deadline on each request's wait,
and the waits' statistics (backpressure, issue 45).

    waiting = WaitQueue(max_rows=32, timeout_s=30.0)
    waiting.enter(job, rows=n, room=k)  # on submit (k slots free); QueueFull (-> 429 + Retry-After) past the bound
    waiting.admitted(job)               # its first row went live: the wait is recorded
    waiting.expired(now)                # jobs past their deadline (-> 503 + Retry-After), removed
    waiting.left(job)                   # cancelled while waiting (a client gone)

A job enters when the server accepts it and leaves at the first of: a row of it admitted to the engine, its
deadline (`timeout_s` after it entered), its cancellation. The bound counts rows (a request of n samples
is n rows) beyond the free slots: a job is refused when the rows already waiting plus its own pass
`max_rows` + the slots free now (a burst into an idle server fills the slots, then the queue), except into
an empty queue (a request of n > max_rows still runs, alone). Retry-After = the median wait of the last
`WINDOW` admitted jobs, rounded up to whole seconds (at least 1): about when a slot frees up.
Thread-safe: jobs enter on the event loop and leave on the engine thread.
"""
from __future__ import annotations

import collections
import math
import threading
import time

import numpy as np

WINDOW = 1024  # recent waits kept for the percentiles
QUANTILES = (0.5, 0.9, 0.99)


class QueueFull(Exception):
  """The waiting queue's bound is reached; `retry_after` seconds is the advice for the client."""

  def __init__(self, message: str, retry_after: int):
    super().__init__(message)
    self.retry_after = retry_after


class WaitQueue:
  """Module docstring. max_rows None: unbounded; timeout_s None: no deadline."""

  def __init__(self, max_rows: int | None = None, timeout_s: float | None = None, clock=time.monotonic):
    if max_rows is not None and max_rows < 1:
      raise ValueError(f"max_waiting={max_rows}: must be >= 1 (or None: unbounded)")
    if timeout_s is not None and not timeout_s > 0:
      raise ValueError(f"queue_timeout={timeout_s}: must be > 0 seconds (or None: no deadline)")
    self.max_rows, self.timeout_s, self.clock = max_rows, timeout_s, clock
    self._jobs: dict = {}  # job -> (entered at, rows), oldest first
    self._rows = 0
    self._lock = threading.Lock()
    self.waits: collections.deque = collections.deque(maxlen=WINDOW)
    self.stats = {"admitted": 0, "rejected_full": 0, "expired": 0, "wait_s_sum": 0.0}

  @property
  def rows(self) -> int:
    """Rows waiting now."""
    return self._rows

  def jobs(self) -> list:
    """The waiting jobs, oldest first."""
    with self._lock:
      return list(self._jobs)

  def retry_after(self) -> int:
    """Seconds a refused client should wait (module docstring)."""
    waits = list(self.waits)
    return max(1, math.ceil(float(np.median(waits)))) if waits else 1

  def enter(self, job, rows: int, room: int = 0, final: bool = True) -> None:
    """Queues `job` of `rows` rows; QueueFull if the rows waiting plus these pass the bound plus `room`
    (decode slots free now); final=False: a refusal the caller may retry, not counted in stats."""
    with self._lock:
      if self.max_rows is not None and self._rows and self._rows + rows > self.max_rows + max(room, 0):
        self.stats["rejected_full"] += final
        raise QueueFull(f"the server is at capacity: {self._rows} rows wait for a decode slot and this request "
                        f"adds {rows} (--max-waiting {self.max_rows}); retry later", self.retry_after())
      self._jobs[job] = (self.clock(), rows)
      self._rows += rows

  def admitted(self, job) -> float | None:
    """`job`'s first row went live: its wait (s), recorded; None if it was not waiting."""
    with self._lock:
      entry = self._jobs.pop(job, None)
      if entry is None:
        return None
      self._rows -= entry[1]
      wait = self.clock() - entry[0]
      self.waits.append(wait)
      self.stats["admitted"] += 1
      self.stats["wait_s_sum"] += wait
      return wait

  def left(self, job) -> None:
    """`job` stopped waiting without a row admitted (cancelled, failed)."""
    with self._lock:
      entry = self._jobs.pop(job, None)
      if entry is not None:
        self._rows -= entry[1]

  def expired(self, now: float | None = None) -> list:
    """The jobs that waited longer than `timeout_s` (removed from the queue), oldest first."""
    if self.timeout_s is None:
      return []
    now = self.clock() if now is None else now
    with self._lock:
      out = [job for job, (t, _) in self._jobs.items() if now - t > self.timeout_s]
      for job in out:
        self._rows -= self._jobs.pop(job)[1]
      self.stats["expired"] += len(out)
      return out

  def wait_quantiles(self) -> dict[float, float]:
    """{q: the q-quantile of the recent waits (s)} for q in QUANTILES (NaN before any)."""
    waits = np.asarray(list(self.waits), np.float64)
    return {q: float(np.quantile(waits, q)) if waits.size else float("nan") for q in QUANTILES}
