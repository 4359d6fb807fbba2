"""One thread drives an `Engine`; other threads hand it work as commands run between engine steps.

    driver = EngineThread(make_engine, on_failure=fail_requests).start()
    future = driver.call(lambda engine: engine.submit(request))   # fn(engine) runs on the engine thread
    driver.stop()

The loop: run the queued commands (each one's result or exception goes to its future), then one
`engine.step()` (admission, prefill, one decode chunk), then `after_step(engine)`; when a step did nothing
and no command waits, sleep until `call` wakes it. `gather_s` (a server's burst): when commands arrive
at an idle engine (its last step did nothing), more are awaited before the step while each follows the last
within `quiet_s`, for at most `gather_s`: requests sent together start decoding in one chunk instead of the
first one's chunk holding back the others for a whole chunk. Engine callbacks (`Request.on_update`) therefore run on
this thread, where they may cancel or submit. A step that raises (a device call failed) fails the engine:
a fresh one from `make_engine()` takes its place and `on_failure(old_engine, exception)` tells the owner,
whose requests in the old engine are gone; the thread keeps serving. `engine_factory` makes such a
`make_engine` for rows of a fixed context.
"""
from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
import traceback
from typing import Callable

from fineflax.engine.decode import decode_impl, prepare_decode_params
from fineflax.engine.engine import Engine
from fineflax.engine.pages import pages_for
from fineflax.engine.tensor_parallel import shard_decode_params, tp_size


def engine_factory(params, config, *, max_rows: int, context: int, page_size: int = 16, impl: str | None = "auto",
                   dtype, dense_base: bool = False, mesh=None, num_pages: int | None = None,
                   **engine_kwargs) -> Callable[[], Engine]:
  """make_engine() -> a fresh `Engine` of `max_rows` rows, each up to `context` positions: pages_for(context)
  pages a row (max_pages_per_row) and a pool of max_rows x (that + 1) pages plus the trash page (num_pages:
  a pool of that many pages instead, the trash page included: rows then wait for pages, not only slots). The decode
  params are prepared once (`prepare_decode_params`, impl, dtype, dense_base) and shared by every engine it
  makes; `engine_kwargs` go to `Engine` (chunk_size, tokenizer, eos_ids, lora, adapters, ...). mesh: decode
  tensor-parallel over its "model" axis (`engine.tensor_parallel`; the params are split once, here)."""
  impl = decode_impl(impl)
  if tp_size(mesh) > 1:
    prepared = shard_decode_params(prepare_decode_params(params, config, impl, dtype, dense_base, fuse=False),
                                   config, mesh)
  else:
    prepared, mesh = prepare_decode_params(params, config, impl, dtype, dense_base), None
  row_pages = pages_for(context, page_size)
  if num_pages is not None and num_pages < 2:
    raise ValueError(f"num_pages={num_pages}: the pool needs the trash page and at least one more")
  kwargs = dict(max_rows=max_rows, num_pages=num_pages or max_rows * (row_pages + 1) + 1, page_size=page_size,
                max_pages_per_row=row_pages, dtype=dtype, impl=impl, prepared=True, mesh=mesh,
                **engine_kwargs)
  return lambda: Engine(prepared, config, **kwargs)


class EngineThread:
  def __init__(self, make_engine: Callable, *, on_failure: Callable | None = None,
               after_step: Callable | None = None, name: str = "fineflax-engine", gather_s: float = 0.0,
               quiet_s: float = 0.002):
    self.make_engine, self.on_failure, self.after_step, self.name = make_engine, on_failure, after_step, name
    self.gather_s, self.quiet_s = float(gather_s), float(quiet_s)
    self.engine = make_engine()
    self._commands: collections.deque = collections.deque()
    self._lock = threading.Lock()
    self._wake = threading.Event()
    self._thread: threading.Thread | None = None
    self._running = False

  def call(self, fn: Callable) -> concurrent.futures.Future:
    """Runs fn(engine) on the engine thread before its next step; the future holds its result."""
    future = concurrent.futures.Future()
    with self._lock:
      self._commands.append((fn, future))
    self._wake.set()
    return future

  @property
  def queued(self) -> int:
    """Commands not yet run."""
    return len(self._commands)

  def start(self) -> "EngineThread":
    if self._thread is None:
      self._running = True
      self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
      self._thread.start()
    return self

  def stop(self, timeout: float = 30.0) -> None:
    self._running = False
    self._wake.set()
    if self._thread is not None:
      self._thread.join(timeout=timeout)
      self._thread = None

  def _loop(self) -> None:
    idle = True  # the last step did nothing
    while self._running:
      ran = self._run_commands()
      if ran and idle and self.gather_s > 0:
        self._gather()
      try:
        did = self.engine.step()
        if self.after_step is not None:
          self.after_step(self.engine)
      except Exception as e:  # the engine is in an unknown state: replace it, tell the owner
        traceback.print_exc()
        failed, self.engine = self.engine, self.make_engine()
        if self.on_failure is not None:
          try:
            self.on_failure(failed, e)
          except Exception:
            traceback.print_exc()
        continue
      idle = not did
      if not did and not ran and not self._commands:
        self._wake.wait(0.05)
        self._wake.clear()

  def _gather(self) -> None:
    """Runs the commands that keep arriving, each within `quiet_s` of the last, for at most `gather_s`."""
    deadline = time.perf_counter() + self.gather_s
    while self._running and (left := deadline - time.perf_counter()) > 0:
      self._wake.clear()
      if not self._commands and not self._wake.wait(min(self.quiet_s, left)):
        return
      self._run_commands()

  def _run_commands(self) -> bool:
    ran = False
    while True:
      with self._lock:
        if not self._commands:
          return ran
        fn, future = self._commands.popleft()
      ran = True
      try:
        future.set_result(fn(self.engine))
      except Exception as e:
        future.set_exception(e)
