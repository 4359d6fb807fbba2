"""The device calls of an engine step and their host bookkeeping: prefill blocks, decode chunks, page
copies (copy on write), block tables and row buckets, then tokens appended, stop strings cut, finished
sequences released.

`DeviceCalls` is a mixin of `fineflax.engine.engine.Engine`; it reads the engine's params, pool, lora,
pages, live rows, bucket settings and stats, the compiled programs (`engine.programs.CompiledPrograms`) and
the preemption of `engine.schedule.Scheduler` (`_make_room`).
"""
from __future__ import annotations

import time

import jax
import numpy as np

from fineflax.engine import device, tensor_parallel as tp
from fineflax.engine.adapters import row_weights
from fineflax.engine.decode import bucket
from fineflax.engine.pages import pages_for
from fineflax.engine.processors import RowFilters
from fineflax.engine.sequence import Sequence
from fineflax.engine.stops import StopScan

MIN_READ_TOKENS = 128  # block tables are at least this many tokens wide (fewer compiled programs)


class DeviceCalls:
  """The prefill and decode calls of an `Engine` step (module docstring)."""

  def _prefill(self) -> bool:
    """Feeds tokens not yet in the cache (prompts, appended tool output): one block of at most
    `prefill_chunk` tokens per sequence. While other rows decode (or with `interleave_prefill`), one call of
    at most `prefill_tokens` tokens per step (decoding rows do not wait for a flood of new prompts);
    otherwise all of them."""
    todo = [s for s in self.live if s.status == "prefill"]
    for s in todo:
      if self.prefix_cache and s.cache_len == 0 and not self.pages.tables[s.id]:
        self._reuse_prefix(s)
      if s.cache_len >= len(s.full) - 1:
        self._prefilled(s)
    todo = [s for s in todo if s.status == "prefill"]
    if not todo:
      return False
    one_call = self.interleave_prefill or any(s.status == "ready" and s.budget > 0 for s in self.live)
    queue, calls = list(todo), 0
    while not (one_call and calls):
      queue = [s for s in queue if s.status == "prefill"]  # a call before may have preempted some
      if not queue:
        break
      longest = min(max(len(s.full) - 1 - s.cache_len for s in queue), self.prefill_chunk)
      width = min(bucket(longest, minimum=16), self.prefill_chunk)
      rows = max(1, min(len(queue), self.prefill_tokens // width))
      batch, queue = queue[:rows], queue[rows:]
      calls += self._prefill_call(batch, width)
    for s in todo:
      if s.status == "prefill" and s.cache_len >= len(s.full) - 1:
        self._prefilled(s)
    return True

  def _prefill_call(self, batch: list[Sequence], width: int) -> bool:
    """One prefill call feeding each row of `batch` its next block (at most `width` tokens); False when
    every row of it was preempted first (`_make_room`)."""
    plan = self._make_room([(s, min(s.cache_len + width, len(s.full) - 1)) for s in batch])
    if not plan:
      return False
    batch = [s for s, _ in plan]
    b = self._rows(len(batch))
    tokens = np.zeros((b, width), np.int32)
    positions = np.zeros((b, width), np.int32)
    valid = np.zeros((b, width), bool)
    copies, ends = [], []
    for r, (s, end) in enumerate(plan):
      seg = s.full[s.cache_len:end]
      tokens[r, :len(seg)] = seg
      positions[r] = s.cache_len + np.arange(width)
      valid[r, :len(seg)] = True
      copies += self.pages.grow(s.id, end)
      ends.append(end)
    self._copy(copies)
    table = self._table(batch, b, self._row_limit() if self.prefill_full_table else max(ends))
    program = self._prefill_program(b, width, table.shape[1])
    self.pool = program(self.params, self.pool, *self._put((table, tokens, positions, valid)), self.lora,
                        self._scale(batch, b))
    for s, end in zip(batch, ends):
      self.stats["prefill_tokens"] += end - s.cache_len
      s.cache_len = end
    self.stats["prefill_calls"] += 1
    self._note_pages()
    return True

  def _reuse_prefix(self, s: Sequence) -> None:
    """s (nothing in its cache yet) starts with the cached pages of its prompt's longest cached prefix
    (all but the last prompt token: the first decode step feeds that one). Looked up when s is about to
    prefill, not at admission: a burst of prompts with one system prompt finds the pages the first of
    them cached a step before."""
    pages = self.pages.match_prefix(s.prompt[:-1], s.request.adapter)
    if pages:
      self.pages.release(s.id)
      self.pages.new(s.id, pages)
      s.cache_len = len(pages) * self.page_size
      self.stats["prefix_hit_tokens"] += s.cache_len

  def _prefilled(self, s: Sequence) -> None:
    """s's cache holds all but its last token: it decodes (budget permitting); its group shares it; with
    the prefix cache its prompt's full pages are cached."""
    s.status = "ready"
    if self.prefix_cache:
      self.pages.cache_prefix(s.id, s.prompt[:-1], s.request.adapter)
    for f in s.followers:
      if f.status == "fork":
        self.pages.fork(s.id, f.id, s.cache_len)
        f.cache_len, f.status = s.cache_len, "ready"
    if s.budget <= 0 and not s.request.hold:
      self._finish(s, "length")

  def _decode(self) -> bool:
    plan = self._make_room([(s, s.cache_len + min(s.budget, self.chunk_size))
                            for s in self.live if s.status == "ready" and s.budget > 0])
    if not plan:
      self._decode_end = None  # decoding pauses: the time until it resumes is no gap between chunks
      return False
    rows, ends, copies = [s for s, _ in plan], [end for _, end in plan], []
    for s, end in plan:
      copies += self.pages.grow(s.id, end)
    self._copy(copies)
    b = self._rows(len(rows))
    table = self._table(rows, b, max(ends))
    e = self._eos_width(max(len(s.eos) for s in rows))
    pad = b - len(rows)
    col = lambda f, dt: np.array([f(s) for s in rows] + [0] * pad, dt)
    state = {"pending": col(lambda s: s.full[-1], np.int32), "pos": col(lambda s: s.cache_len, np.int32),
             "budget": col(lambda s: s.budget, np.int32), "count": col(lambda s: s.count, np.int32),
             "active": col(lambda s: True, bool), "temperature": col(lambda s: s.request.temperature, np.float32),
             "top_k": col(lambda s: s.request.top_k, np.int32), "top_p": np.array(
                 [s.request.top_p for s in rows] + [1.0] * pad, np.float32),
             "key": np.stack([s.key for s in rows] + [np.zeros(2, np.uint32)] * pad),
             "eos": np.array([list(s.eos) + [-1] * (e - len(s.eos)) for s in rows] + [[-1] * e] * pad, np.int32)}
    filters = RowFilters.of(state["temperature"][:len(rows)], state["top_k"][:len(rows)],
                            state["top_p"][:len(rows)])
    program = self._decode_program(b, table.shape[1], e, filters)
    inputs = self._put((table, state))
    if self.before_decode_call is not None:
      self.before_decode_call()
    t0 = time.perf_counter()
    if self._decode_end is not None:  # host time since the last chunk's results: bookkeeping, admission, prefill
      self.stats["gap_s"] += t0 - self._decode_end
      self.stats["gaps"] += 1
    self.pool, st, eos, out = program(self.params, self.pool, *inputs, self.lora, self._scale(rows, b))
    t1 = time.perf_counter()
    st, eos, out = jax.device_get((st, eos, out))
    self._decode_end = time.perf_counter()
    self.stats["dispatch_s"] += t1 - t0  # the call returning (0 where dispatch is asynchronous)
    self.stats["wait_s"] += self._decode_end - t1  # then waiting for the chunk's results
    self.stats["decode_calls"] += 1
    self.stats["peak_rows"] = max(self.stats["peak_rows"], len(rows))
    self.stats["decode_rows"] += len(rows)
    self.stats["mixed_adapter_calls"] += len({s.request.adapter for s in rows}) > 1
    self.stats["decode_steps"] += int(out["steps"])
    self._note_pages()
    updated = []
    for r, s in enumerate(rows):
      n = int(out["emitted"][r].sum())
      s.tokens += out["tokens"][r, :n].tolist()
      s.logprobs += out["logprobs"][r, :n].tolist()
      s.raw_logprobs += out["raw_logprobs"][r, :n].tolist()
      s.model += [True] * n
      s.cache_len += n
      s.count += n
      s.budget = int(st["budget"][r])
      self.pages.truncate(s.id, s.cache_len)
      status = None
      if not st["active"][r]:
        status = "eos" if eos[r] else "length"
      if s.stop_strings and self._cut_at_stop(s):
        status = "stop"
      if status is not None:
        self._finish(s, status, notify=False)
      if (n or status) and s.request.on_update is not None:
        updated.append(s)
    for s in updated:  # after the bookkeeping: a callback may cancel or submit
      s.request.on_update(s)
    return True

  def _finish(self, s: Sequence, status: str, force_release: bool = False, notify: bool = True) -> None:
    s.status, s.budget = status, 0
    if force_release or not s.request.hold:
      self.release(s)
    if notify and s.request.on_update is not None:
      s.request.on_update(s)

  def _cut_at_stop(self, s: Sequence) -> bool:
    """Cuts s after the shortest prefix of its current segment whose text holds a stop string
    (`engine.stops.stop_cut`, found incrementally: `StopScan` decodes only the new tokens); True if cut.
    The cache is cut back to the kept tokens."""
    scan = s.stop_scan  # a new one when the segment, its stop strings or its tokens (cut back) changed
    if scan is None or scan.key != (s.seg_start, s.stop_strings) or scan.fed > len(s.tokens) - s.seg_start:
      s.stop_scan = StopScan(s.stop_strings, self._text, s.seg_start)
    cut = s.stop_scan.scan(s.tokens)
    if cut is None:
      return False
    end = s.seg_start + cut[0]
    del s.tokens[end:], s.logprobs[end:], s.raw_logprobs[end:], s.model[end:]
    s.excess_chars = cut[1]
    s.cache_len = len(s.full) - 1
    self.pages.truncate(s.id, s.cache_len)
    return True

  def _scale(self, seqs: list[Sequence], rows: int):
    """The LoRA scale of a device call over `seqs` (then rows - len(seqs) padding rows): the engine's
    scalar, or with per-row adapters each row's weights [rows, A] (`adapters.row_weights`)."""
    if self.adapter_scales is None:
      return self.lora_scale
    ids = [s.request.adapter for s in seqs] + [None] * (rows - len(seqs))
    return self._put(row_weights(ids, self.adapter_scales))

  def _put(self, x):
    """Host inputs (a pytree) of a device call: on the device, or replicated over the mesh (tensor
    parallelism). device_put, not jnp.asarray: in jax >= 0.10 asarray of a NumPy array compiles a `stage`
    program per shape (a compile inside served traffic that warm-up cannot know of)."""
    return jax.device_put(x) if self.mesh is None else jax.device_put(x, tp.replicated(self.mesh))

  def _copy(self, copies: list[tuple[int, int]]) -> None:
    if not copies:
      return
    width = device.row_bucket(len(copies))
    src = np.zeros(width, np.int32)
    dst = np.zeros(width, np.int32)
    src[:len(copies)], dst[:len(copies)] = zip(*copies)
    self.pool = self._copy_program(width)(self.pool, *self._put((src, dst)))
    self.stats["copied_pages"] += len(copies)

  def _eos_width(self, most: int) -> int:
    """EOS columns of a decode call whose rows have at most `most` EOS ids: that or the engine's own count,
    rounded up to a multiple of 4 (rows of no EOS, e.g. a server's ignore_eos, share the default's program)."""
    return -(-max(most, len(self.eos_ids), 1) // 4) * 4

  def _rows(self, n: int) -> int:
    """Rows of a device call for n sequences: the row bucket (`device.row_bucket`, base 4 with
    coarse_buckets, capped at the bucket of max_rows)."""
    if not self.coarse_buckets:
      return device.row_bucket(n, self.min_row_bucket)
    return min(device.row_bucket(n, self.min_row_bucket, 4), device.row_bucket(self.max_rows, self.min_row_bucket))

  def _table_width(self, longest: int) -> int:
    """Pages read per row for sequences of at most `longest` positions: the page bucket, at least
    MIN_READ_TOKENS worth (short sequences share one program; their reads are small anyway)."""
    limit = self.max_pages_per_row or (self.pages.num_pages - 1)
    need = max(pages_for(longest, self.page_size), pages_for(MIN_READ_TOKENS, self.page_size))
    return device.page_bucket(need, limit, steps=1 if self.coarse_buckets else 2)

  def _table(self, seqs: list[Sequence], rows: int, longest: int) -> np.ndarray:
    """Block table [rows, n] of `seqs` (then trash rows), n = `_table_width` of the longest sequence."""
    n = self._table_width(longest)
    table = self.pages.block_table([s.id for s in seqs], n)
    return np.concatenate([table, np.zeros((rows - len(seqs), n), np.int32)])

  def _note_pages(self) -> None:
    self.stats["peak_pages"] = max(self.stats["peak_pages"], self.pages.num_used)
