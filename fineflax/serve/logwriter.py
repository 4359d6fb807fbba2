"""Group commit of the response log: the answers that finish together are written in one transaction.

    writer = LogWriter(log)             # log: serve.feedback.FeedbackLog (its add_responses(rows))
    await writer.add(rows)              # returns once the rows are committed (or raises what the write raised)

A request's rows are written before its client gets the end of its answer (`[DONE]` or the JSON), so that a
/feedback naming its id finds it. Each `add` on a worker thread of its own made one hop and one commit per
request: 128 streams ending in the same decode chunk waited for 128 commits in a row before their clients
could send their next requests. Here one writer thread takes every batch queued while the last commit ran
and writes them with one `add_responses` call (one transaction); each waiting request is then resumed on its
event loop (one `call_soon_threadsafe` per loop and batch). A failed write fails every request of its batch.
"""
from __future__ import annotations

import asyncio
import collections
import threading


class LogWriter:
  """Module docstring. The writer thread starts on the first `add` (a daemon; `close` ends it)."""

  def __init__(self, log):
    self.log = log
    self._pending: list = []  # (rows, future, loop)
    self._cond = threading.Condition()
    self._thread: threading.Thread | None = None
    self._closed = False
    self.batches = 0  # transactions written (a burst's answers share one)

  async def add(self, rows: list[dict]) -> None:
    """Writes `rows` in the next transaction; returns after its commit (or raises its error)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    with self._cond:
      if self._closed:
        raise RuntimeError("the response log writer is closed")
      self._pending.append((rows, future, loop))
      if self._thread is None:
        self._thread = threading.Thread(target=self._run, name="fineflax-log", daemon=True)
        self._thread.start()
      self._cond.notify()
    await future

  def close(self, timeout: float = 30.0) -> None:
    """Writes what is queued, then stops the thread."""
    with self._cond:
      self._closed = True
      self._cond.notify()
      thread = self._thread
    if thread is not None:
      thread.join(timeout)

  def _run(self) -> None:
    while True:
      with self._cond:
        while not self._pending and not self._closed:
          self._cond.wait()
        batch, self._pending = self._pending, []
      if not batch:
        return
      try:
        self.log.add_responses([row for rows, _, _ in batch for row in rows])
        error = None
      except Exception as e:  # every request of the batch answers with it
        error = e
      self.batches += 1
      by_loop = collections.defaultdict(list)
      for _, future, loop in batch:
        by_loop[loop].append(future)
      for loop, futures in by_loop.items():
        loop.call_soon_threadsafe(_settle, futures, error)


def _settle(futures, error) -> None:
  for f in futures:
    if not f.done():  # (a request cancelled meanwhile: nothing waits for it)
      f.set_exception(error) if error is not None else f.set_result(None)
