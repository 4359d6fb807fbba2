"""The benchmark runner's generation loop: every row's n samples through one `Engine` (continuous batching),
admitted in waves, while a writer thread records, grades and appends the finished rows.

    wave = admission_wave(live, n)          # completions submitted at once
    stats = decode_rows(engine, prompts, keys, n=n, max_new_tokens=..., temperature=..., top_p=...,
                        wave=wave, live=live, on_rows=recorder.put)

Continuous batching: `live` completions decode at once; when a row's n samples have finished its slots go to
the next rows, so no decode step waits for the longest completion of a fixed batch (chunked `generate` calls
end each call with their longest row). Admission sizes are bounded: new rows are handed to the engine only
in waves of `wave` completions (whole rows of n), once that many slots are free, so a prefill runs
k * wave / n prompts for a few k (k * wave <= live) and compiles a few programs (rows are bucketed to powers
of two: `device.row_bucket`), not one per admission size as first-come admission of every freed slot did.
Sampling keys are per row and sample, not per batch: sample j of a row is drawn with fold_in(fold_in(
PRNGKey(seed), row_id), j) (`sample_keys`; token t of it with fold_in(that, t), `Engine`), so a row's
completions do not depend on the wave, the batch size or what a resumed run had done before.
"""
from __future__ import annotations

import collections
import concurrent.futures
import concurrent.futures.process
import dataclasses
import json
import os
import time
import zlib
from typing import Callable, Sequence

import numpy as np


def row_id(benchmark: str, where: str) -> int:
  """A row's stable 31-bit id: CRC-32 of "benchmark\\0where" (its file and row), for its sampling keys."""
  return zlib.crc32(f"{benchmark}\0{where}".encode()) & 0x7FFFFFFF


def sample_keys(seed: int, ids: Sequence[int], n: int) -> np.ndarray:
  """uint32 [R, n, 2] threefry key data: key[r, j] = fold_in(fold_in(PRNGKey(seed), ids[r]), j), on the host
  (`engine.keys`: no device call; imported here, as the grading processes import this module without JAX)."""
  from fineflax.engine.keys import fold_in, seed_key
  base = seed_key(seed)
  out = np.zeros((len(ids), n, 2), np.uint32)
  for r, i in enumerate(ids):
    row = fold_in(base, i)
    out[r] = [fold_in(row, j) for j in range(n)]
  return out


def admission_wave(live: int, n: int) -> int:
  """Completions handed to the engine at once: an eighth of the `live` slots, whole rows of n (at least one
  row). Smaller waves keep more slots busy (on average about live - wave / 2), larger ones prefill more
  prompts per call; 1/8 keeps ~94% of the slots busy with prefills of live / (8n) prompts."""
  return max(live // 8 // n, 1) * n


@dataclasses.dataclass
class LoopStats:
  """Seconds in engine steps (device calls and the engine's bookkeeping) and in the loop's own host work
  between them (admission, collecting finished rows); prefill / decode calls; admission sizes seen."""
  engine_seconds: float = 0.0
  host_seconds: float = 0.0
  steps: int = 0
  admissions: collections.Counter = dataclasses.field(default_factory=collections.Counter)


def decode_rows(engine, prompts: Sequence[list[int]], keys: np.ndarray, *, n: int, max_new_tokens: int,
                temperature: float, top_p: float, wave: int, live: int,
                on_rows: Callable[[list[tuple[int, list]]], None], emit: int | None = None) -> LoopStats:
  """Decodes n samples of each prompt (keys[r, j] for sample j of row r) on `engine` (max_rows >= live),
  handing rows to it in waves (module docstring); calls on_rows([(r, [n finished Sequences]), ...]) with
  finished rows in batches of at least `emit` completions (default `wave`), the rest at the end."""
  if wave % n or not n <= wave <= live:
    raise ValueError(f"wave={wave}: must be a multiple of n={n} between n and live={live}")
  from fineflax.engine import Request  # here: the grading processes import this module without JAX
  emit = wave if emit is None else emit
  stats, todo, active, ready = LoopStats(), collections.deque(range(len(prompts))), {}, []
  t_host = time.perf_counter()
  while todo or active:
    busy = len(engine.live) + sum(len(g) for g in engine.waiting)
    admitted = 0
    while todo and live - busy - admitted >= wave:
      for _ in range(wave // n):
        if not todo:
          break
        r = todo.popleft()
        active[r] = engine.submit_group([
            Request(prompts[r], max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                    top_p=float(top_p), key=keys[r, j]) for j in range(n)])
        admitted += n
    if admitted:
      stats.admissions[admitted] += 1
    t0 = time.perf_counter()
    stats.host_seconds += t0 - t_host
    did = engine.step()
    t_host = time.perf_counter()
    stats.engine_seconds += t_host - t0
    stats.steps += 1
    for r in [r for r, seqs in active.items() if all(s.finished for s in seqs)]:
      ready.append((r, active.pop(r)))
    if len(ready) * n >= emit or (ready and not active and not todo):
      on_rows(ready)
      ready = []
    if not did and not admitted and active:
      raise RuntimeError(f"{len(active)} rows wait for engine rows that never free up (the pool's pages?)")
  stats.host_seconds += time.perf_counter() - t_host
  return stats


class Recorder:
  """Builds the records of finished rows, grades them (in `pool`'s processes when given) and appends them
  to the open file `f`, on one background thread, so the main thread goes back to the engine at once.

  put(rows) queues [(r, seqs)]; close() waits for the last grades and writes; returns its wait in seconds.
  `record(r, j, text, seq)` -> (record dict, grading job tuple); `grade_all(jobs)` -> verdicts (the pool
  runs it); a BrokenProcessPool grades the rest in this process."""

  def __init__(self, f, tokenizer, record: Callable, grade_all: Callable, pool=None):
    self.f, self.tok, self.record, self.grade_all, self.pool = f, tokenizer, record, grade_all, pool
    self.thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bench-recorder")
    self.tasks: list[concurrent.futures.Future] = []
    self.pending: list[tuple[list, list, concurrent.futures.Future]] = []
    self.tokens = 0

  def put(self, rows: list[tuple[int, list]]) -> None:
    self.tasks.append(self.thread.submit(self._handle, list(rows)))
    while self.tasks and self.tasks[0].done():
      self.tasks.pop(0).result()  # re-raises what failed on the thread

  def close(self) -> float:
    t0 = time.perf_counter()
    for task in self.tasks:
      task.result()
    self.thread.submit(self._write, True).result()
    self.thread.shutdown()
    return time.perf_counter() - t0

  def _handle(self, rows: list[tuple[int, list]]) -> None:
    batch, jobs = [], []
    for r, seqs in rows:
      for j, seq in enumerate(seqs):
        text = self.tok.decode(seq.tokens, skip_special_tokens=True)
        rec, job = self.record(r, j, text[:len(text) - seq.excess_chars], seq)
        batch.append(rec)
        jobs.append(job)
        self.tokens += len(seq.tokens)
    future = None
    if self.pool is not None:
      try:
        future = self.pool.submit(self.grade_all, jobs)
      except concurrent.futures.process.BrokenProcessPool:
        self.pool = None
    if future is None:
      future = concurrent.futures.Future()
      future.set_result(self.grade_all(jobs))
    self.pending.append((batch, jobs, future))
    self._write(False)

  def _write(self, wait: bool) -> None:
    wrote = False
    while self.pending and (wait or self.pending[0][2].done()):
      batch, jobs, future = self.pending.pop(0)
      try:
        verdicts = future.result()
      except concurrent.futures.process.BrokenProcessPool:  # a worker died: grade here instead
        verdicts = self.grade_all(jobs)
      self.f.writelines(json.dumps(dict(rec, correct=v)) + "\n" for rec, v in zip(batch, verdicts))
      wrote = True
    if wrote:
      self.f.flush()
      os.fsync(self.f.fileno())
