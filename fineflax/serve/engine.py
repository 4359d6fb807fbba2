"""Continuous batching: a fixed number of decode slots, one background thread, one jitted step for all.

    engine = Engine(params, config, tokenizer, adapters={"math": (lora, cfg)}, slots=8, context=1024)
    engine.start()
    job = Job(prompt=ids, n=2, max_tokens=64, temperature=0.7, adapter="math", emit=callback)
    engine.submit(job)        # callback(event) from the engine thread, see `Job`
    engine.cancel(job)        # its rows leave the batch at the next step

Loop of the engine thread: (1) admit waiting completions into free slots: their prompts (all but the
last token) are prefilled in one batched call and the last token becomes the row's pending token;
(2) run `decode_slots` for `chunk` steps over slots 0..R-1, R = the highest busy slot + 1 rounded up to a
power of two (new rows take the lowest free slots; rows of different adapters and sampling settings
share the call); (3) hand new tokens to their jobs: text deltas (held back while they might be the start
of a stop string or an incomplete UTF-8 character), stop strings, EOS, budget; finished and cancelled
rows free their slot. A request that arrives mid-generation joins at the next chunk.

Errors: an exception while admitting one row or handling its output (its settings, stop strings, text,
callback) ends that row's request with an ("error", message) event; the other rows keep going. Only a
failure of a batched call (prefill, decode) fails every request in flight.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time
import traceback
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fineflax.engine.decode import bucket, cast_params
from fineflax.serve.model import decode_slots, init_slot_cache, prefill_rows, stack_adapters


@dataclasses.dataclass(eq=False)
class Job:
  """One chat request: `n` completions of `prompt` (token ids) with one adapter and sampling settings.

  emit(event) is called from the engine thread with ("delta", index, text, logprob_entries),
  ("done", index, finish_reason, completion_tokens) or ("error", message). finish_reason: "stop" (EOS
  or a stop string, which is cut from the text) or "length". logprob entries: (token_id, logprob).
  """
  prompt: list
  emit: Callable
  n: int = 1
  max_tokens: int = 16
  temperature: float = 1.0
  top_p: float = 1.0
  stop: tuple = ()
  seed: int | None = None
  adapter: str | None = None
  ignore_eos: bool = False
  cancelled: bool = False
  texts: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(eq=False)
class _Row:
  job: Job
  index: int
  seed: int
  tokens: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  sent: int = 0  # characters of text already emitted
  logged: int = 0  # tokens whose logprobs were already emitted
  done: bool = False


class Engine:
  """The slot scheduler (see module docstring). adapters: {name: (lora, LoraConfig)}; id 0 = the base."""

  def __init__(self, params, config, tokenizer, *, adapters=None, slots: int = 8, context: int = 1024,
               dtype=jnp.bfloat16, chunk: int = 8, eos_ids: Sequence[int] | None = None):
    self.params, self.config, self.tokenizer = cast_params(params, dtype), config, tokenizer
    self.dtype = dtype
    adapters = dict(adapters or {})
    self.adapter_ids = {name: i + 1 for i, name in enumerate(adapters)}
    self.lora = stack_adapters(list(adapters.values()))
    self.slots, self.context, self.chunk = int(slots), int(context), int(chunk)
    if self.slots < 1 or self.context < 2 or self.chunk < 1:
      raise ValueError(f"slots={slots}, context={context}, chunk={chunk}: need slots >= 1, context >= 2, "
                       "chunk >= 1")
    if eos_ids is None:
      eos_ids = list(config.eos_token_ids)
      if tokenizer is not None and tokenizer.eos_token_id is not None:
        eos_ids.append(tokenizer.eos_token_id)
    self.eos_ids = sorted({int(t) for t in eos_ids})
    width = -(-max(len(self.eos_ids), 1) // 4) * 4
    self._eos = jnp.asarray(self.eos_ids + [-1] * (width - len(self.eos_ids)), jnp.int32)
    self.cache = init_slot_cache(config, self.slots, self.context, dtype)
    n = self.slots
    self.state = {"pending": np.zeros(n, np.int32), "pos": np.zeros(n, np.int32),
                  "budget": np.zeros(n, np.int32), "active": np.zeros(n, bool),
                  "ignore_eos": np.zeros(n, bool),
                  "lora_ids": np.zeros(n, np.int32), "seed": np.zeros(n, np.uint32),
                  "temperature": np.zeros(n, np.float32), "top_p": np.ones(n, np.float32)}
    self.rows: list[_Row | None] = [None] * n
    self.waiting: collections.deque = collections.deque()
    self.lock = threading.Lock()
    self.wake = threading.Event()
    self.thread: threading.Thread | None = None
    self.running = False
    self.stats = {"decode_calls": 0, "mixed_adapter_calls": 0, "max_active": 0, "generated_tokens": 0,
                  "prefill_calls": 0, "cancelled_rows": 0, "errors": 0}

  # -- public, any thread ------------------------------------------------------------------------
  def submit(self, job: Job) -> None:
    """Queues the job's n completions (ValueError for an unknown adapter or a too-long request)."""
    if job.adapter is not None and job.adapter not in self.adapter_ids:
      raise ValueError(f"unknown adapter {job.adapter!r}; loaded: {sorted(self.adapter_ids)}")
    if not job.prompt:
      raise ValueError("empty prompt")
    if len(job.prompt) + job.max_tokens > self.context:
      raise ValueError(f"prompt of {len(job.prompt)} tokens + max_tokens={job.max_tokens} exceeds the "
                       f"context of {self.context} tokens")
    base_seed = job.seed if job.seed is not None else int.from_bytes(os.urandom(4), "little")
    job.texts = [""] * job.n
    with self.lock:
      for i in range(job.n):
        self.waiting.append(_Row(job, i, (int(base_seed) + i) & 0xFFFFFFFF))
    self.wake.set()

  def cancel(self, job: Job) -> None:
    """Marks the job cancelled; its waiting rows are dropped and its running rows freed at the next step."""
    job.cancelled = True
    self.wake.set()

  def active_rows(self) -> int:
    return int(sum(r is not None for r in self.rows))

  def start(self) -> "Engine":
    if self.thread is None:
      self.running = True
      self.thread = threading.Thread(target=self._loop, name="fineflax-engine", daemon=True)
      self.thread.start()
    return self

  def stop(self) -> None:
    self.running = False
    self.wake.set()
    if self.thread is not None:
      self.thread.join(timeout=30)
      self.thread = None

  # -- engine thread -----------------------------------------------------------------------------
  def _loop(self):
    while self.running:
      try:
        self._drop_cancelled()
        self._admit()
        if not self.state["active"].any():
          self.wake.wait(0.05)
          self.wake.clear()
          continue
        self._step()
      except Exception as e:  # a failed step fails the requests in flight, not the server
        self.stats["errors"] += 1
        traceback.print_exc()
        self._fail_all(f"engine error: {type(e).__name__}: {e}")

  def _fail_all(self, message):
    jobs = {r.job for r in self.rows if r is not None}
    for b in range(self.slots):
      self._free(b)
    for job in jobs:
      job.emit(("error", message))
    self.cache = init_slot_cache(self.config, self.slots, self.context, self.dtype)

  def _free(self, b):
    self.rows[b] = None
    self.state["active"][b] = False

  def _fail_row(self, b, e):
    """Ends row b's request with an error event (its other rows leave at the next step); the batch goes on."""
    job = self.rows[b].job
    self._free(b)
    self.stats["errors"] += 1
    traceback.print_exc()
    if not job.cancelled:
      job.cancelled = True
      try:
        job.emit(("error", f"request failed: {type(e).__name__}: {e}"))
      except Exception:  # the client is gone: nothing to tell
        traceback.print_exc()

  def _drop_cancelled(self):
    for b, row in enumerate(self.rows):
      if row is not None and row.job.cancelled:
        self._free(b)
        self.stats["cancelled_rows"] += 1
    with self.lock:
      if any(r.job.cancelled for r in self.waiting):
        self.waiting = collections.deque(r for r in self.waiting if not r.job.cancelled)

  def _admit(self):
    free = [b for b in range(self.slots) if self.rows[b] is None]
    new = []
    with self.lock:
      while free and self.waiting:
        new.append((free.pop(0), self.waiting.popleft()))
    if not new:
      return
    st = self.state
    for b, row in new:
      job = row.job
      self.rows[b] = row
      try:
        st["pending"][b], st["pos"][b] = job.prompt[-1], len(job.prompt) - 1
        st["budget"][b], st["ignore_eos"][b] = job.max_tokens, job.ignore_eos
        st["lora_ids"][b] = self.adapter_ids.get(job.adapter, 0) if job.adapter else 0
        st["seed"][b], st["temperature"][b], st["top_p"][b] = row.seed, job.temperature, job.top_p
        st["active"][b] = True
      except Exception as e:
        self._fail_row(b, e)
    new = [(b, row) for b, row in new if self.rows[b] is row]
    feed = [(b, row.job.prompt[:-1]) for b, row in new if len(row.job.prompt) > 1]
    if not feed:
      return
    width = bucket(max(len(p) for _, p in feed), minimum=16)
    batch = bucket(len(feed), minimum=1)
    tokens = np.zeros((batch, width), np.int32)
    rows = np.full((batch,), self.slots, np.int32)  # padding rows: out of range, writes dropped
    for j, (b, p) in enumerate(feed):
      tokens[j, :len(p)], rows[j] = p, b
    self.cache = prefill_rows(self.params, self.cache, jnp.asarray(tokens), jnp.asarray(rows), self.lora,
                              jnp.asarray(st["lora_ids"][np.minimum(rows, self.slots - 1)]),
                              config=self.config, dtype=self.dtype, span=min(self.context, width))
    self.stats["prefill_calls"] += 1

  def _step(self):
    st = self.state
    active = st["active"].copy()
    need = int(st["pos"][active].max()) + self.chunk + 1
    span = min(self.context, bucket(need, minimum=64, multiple=256))
    use_top_p = bool((active & (st["top_p"] < 1.0) & (st["temperature"] > 0)).any())
    self.stats["decode_calls"] += 1
    self.stats["max_active"] = max(self.stats["max_active"], int(active.sum()))
    if len(set(st["lora_ids"][active].tolist())) > 1:
      self.stats["mixed_adapter_calls"] += 1
    rows = min(self.slots, bucket(int(np.flatnonzero(active).max()) + 1, minimum=1))  # rows 0..rows-1 run
    self.cache, new_state, out = decode_slots(
        self.params, self.cache, {k: jnp.asarray(v[:rows]) for k, v in st.items()}, self._eos, self.lora,
        config=self.config, dtype=self.dtype, span=span, num_steps=self.chunk, use_top_p=use_top_p)
    new_state, out = jax.device_get((new_state, out))
    for k in ("pending", "pos", "budget", "active"):
      st[k][:rows] = new_state[k]
    for b in np.flatnonzero(active):
      try:
        self._finish_step(b, out)
      except Exception as e:  # this row's request fails, the batch goes on
        self._fail_row(b, e)

  def _finish_step(self, b, out):
    """Hands row b's new tokens of the decode call `out` to its job; frees the row when it finished."""
    st, row = self.state, self.rows[b]
    n = int(out["emitted"][b].sum())
    self.stats["generated_tokens"] += n
    row.tokens += out["tokens"][b, :n].tolist()
    row.logprobs += out["logprobs"][b, :n].tolist()
    finished = not st["active"][b]
    reason = "stop" if out["eos"][b] else "length"
    if self._emit_text(row, final=finished):
      finished, reason = True, "stop"
    if finished:
      row.job.emit(("done", row.index, reason, len(row.tokens)))
      row.done = True
      self._free(b)

  def _emit_text(self, row: _Row, final: bool) -> bool:
    """Emits the row's new text; True when a stop string ended it (the text is cut before it)."""
    toks = row.tokens if row.job.ignore_eos else [t for t in row.tokens if t not in self.eos_ids]
    text = self.tokenizer.decode(toks, skip_special_tokens=True)
    stops = [s for s in row.job.stop if s]  # an empty stop string stops nothing
    stop_at = min((text.find(s) for s in stops if s in text), default=-1)
    if stop_at >= 0:
      end, hit = stop_at, True
    else:
      hold = max((len(s) - 1 for s in stops), default=0)
      end, hit = len(text) if final else len(text) - hold, False
      while not final and end > row.sent and text[end - 1] == "\ufffd":
        end -= 1
    if end > row.sent or hit or final:
      delta = text[row.sent:end] if end > row.sent else ""
      entries = list(zip(row.tokens[row.logged:], row.logprobs[row.logged:]))
      row.logged = len(row.tokens)
      row.sent = max(row.sent, end)
      row.job.texts[row.index] = text[:row.sent]
      if delta or entries:
        row.job.emit(("delta", row.index, delta, entries))
    return hit
