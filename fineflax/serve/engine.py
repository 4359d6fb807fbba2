"""The server's requests on the generation engine (`fineflax.engine`): continuous batching over a paged KV
cache, per-row LoRA adapters, one thread driving it.

    engine = Engine(params, config, tokenizer, adapters={"math": (lora, cfg)}, slots=8, context=1024)
    engine.start()
    job = Job(prompt=ids, n=2, max_tokens=64, temperature=0.7, adapter="math", emit=callback)
    engine.submit(job)        # callback(event) from the emitter thread, see `Job`
    engine.cancel(job)        # its rows leave the batch at the next step

A job becomes n engine sequences (one group: the prompt is prefilled once and its pages shared; more
samples than `slots` go in several groups), sampled with keys fold_in(key(seed), i). The engine thread
(`engine.driver.EngineThread`) admits waiting sequences whenever rows and pages free up, between device
chunks of `chunk` decode steps; rows of different adapters and sampling settings share the calls. After
each chunk a sequence's new tokens reach its job: the engine thread only notes them (`Request.on_update`) and
hands them over right before the next chunk's device call; an emitter thread turns them into events while the
device computes: text deltas (decoded incrementally, held back while they might be the start of a stop string or
an incomplete UTF-8 character), log-probs, and at the end ("done", finish reason). A stop string ends the sequence
in the engine (its cache is cut back) and is cut from the text. "stop" = EOS or a stop string; "length" =
max_tokens.

Waiting: a job waits in `waiting.WaitQueue` until a row of it is admitted: a bounded queue (`submit` raises
QueueFull past `max_waiting` rows) with a deadline (`queue_timeout` s: the job then ends with a 503 error
event). A request that could never fit the KV pool (`Limits.pages_needed` > the pool) is refused at `submit`.

Errors: a job whose settings the engine refuses, or whose callback or text handling raises, ends with an
("error", message) event; its sequences are cancelled, the others keep going. Only a failed device call
fails every job in flight (the engine is then rebuilt; the server keeps serving).
"""
from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
import traceback
from typing import Callable, Sequence

import jax.numpy as jnp

from fineflax.engine import Engine as CoreEngine, Request, compiles
from fineflax.engine.engine import FINISHED
from fineflax.engine.keys import row_keys
from fineflax.engine.detok import StreamText, text_decoder
from fineflax.engine.driver import EngineThread, engine_factory
from fineflax.lora import lora_scale
from fineflax.serve.limits import Limits
from fineflax.serve.metrics import snapshot
from fineflax.serve.waiting import QueueFull, WaitQueue

COUNTERS = ("decode_calls", "decode_rows", "prefill_calls", "mixed_adapter_calls", "prefill_tokens",
            "prefix_hit_tokens", "dispatch_s", "wait_s", "gap_s", "gaps")
# summed over the core engines; decode_rows / decode_calls: rows a decode chunk; dispatch_s, wait_s, gap_s: the
# decode calls' seconds in the call, awaiting results and on the host between chunks (`fineflax.engine` stats)


@dataclasses.dataclass(eq=False)
class Job:
  """One chat request: `n` completions of `prompt` (token ids) with one adapter and sampling settings.

  emit(event) is called from the server's emitter thread with ("delta", index, text, logprob_entries),
  ("done", index, finish_reason, completion_tokens) or ("error", message[, status, retry_after]) (status 503
  and retry_after seconds: the queue's deadline passed; else a failure, 500). finish_reason: "stop" (EOS
  or a stop string, which is cut from the text) or "length". logprob entries: (token_id, logprob) with
  logprob = log_softmax(logits)[token] (untempered).
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
  rows: list = dataclasses.field(default_factory=list)
  remote_id: int | None = None  # its id on the link to an engine in another process (`serve.remote`)


@dataclasses.dataclass(eq=False)
class _Row:
  job: Job
  index: int
  seq: object = None  # its engine sequence
  stream: StreamText | None = None  # the completion's text, decoded incrementally
  text: str = ""  # the completion's text so far (its tail may wait to be sent)
  fed: int = 0  # tokens given to `stream`
  sent: int = 0  # characters of text already emitted
  logged: int = 0  # tokens whose logprobs were already emitted
  done: bool = False


class Engine:
  """The server's engine (module docstring). adapters: {name: (lora, LoraConfig)}; slots: rows decoded
  at once; context: positions a request may take (prompt + max_tokens); chunk: decode steps per call;
  page_size: KV page tokens (the pool holds slots x context tokens); prefill_tokens: prompt tokens
  prefilled per engine step at most, each step then decodes a chunk (`Engine(interleave_prefill=True)`: a
  burst of requests does not hold back the first ones' first tokens, nor the running streams);
  prefix_cache: prompts reuse the KV pages of the longest full-page prefix seen before (a shared system
  prompt is prefilled once; `Engine(prefix_cache=True)`), stats prefill_tokens / prefix_hit_tokens. Device
  calls use coarse shape buckets and full-width prefill tables (`Engine(coarse_buckets=True,
  prefill_full_table=True)`), so `warm_up` compiles every program the server can meet (47 at 128 slots and a
  512-token context) before it serves. gather_s: requests reaching an idle engine within 2 ms of each other,
  for up to gather_s, start in one decode chunk (`EngineThread(gather_s=...)`: a burst is not split into a
  first request's chunk and the rest's)."""

  def __init__(self, params, config, tokenizer, *, adapters=None, slots: int = 8, context: int = 1024,
               dtype=jnp.bfloat16, chunk: int = 8, eos_ids: Sequence[int] | None = None, page_size: int = 16,
               impl: str | None = "auto", prefill_tokens: int = 2048, prefix_cache: bool = True,
               gather_s: float = 0.02, num_pages: int | None = None, max_waiting: int | None = None,
               queue_timeout: float | None = None):
    self.slots, self.context, self.chunk = int(slots), int(context), int(chunk)
    if self.slots < 1 or self.context < 2 or self.chunk < 1:
      raise ValueError(f"slots={slots}, context={context}, chunk={chunk}: need slots >= 1, context >= 2, "
                       "chunk >= 1")
    self.config, self.tokenizer, self.dtype = config, tokenizer, dtype
    compiles.install()  # `compile_totals` counts from here: the pool's and the params' programs too
    self._decode = text_decoder(tokenizer)  # ids -> text, skip_special_tokens=True
    adapters = dict(adapters or {})
    self.adapter_ids = {name: i for i, name in enumerate(adapters)}
    stacked = [(lora, lora_scale(cfg)) for lora, cfg in adapters.values()] or None
    make_engine = engine_factory(params, config, max_rows=self.slots, context=self.context, page_size=page_size,
                                 impl=impl, dtype=dtype, chunk_size=self.chunk, tokenizer=tokenizer,
                                 eos_ids=eos_ids, adapters=stacked, prefill_tokens=prefill_tokens,
                                 interleave_prefill=True, prefix_cache=prefix_cache, prefill_full_table=True,
                                 coarse_buckets=True, num_pages=num_pages, before_decode_call=self._hand_over)
    self.page_size = int(page_size)
    self.waiting = WaitQueue(max_waiting, queue_timeout)  # not yet admitted: bound, deadline, wait times
    self.driver = EngineThread(make_engine, on_failure=self._engine_failed, after_step=self._after_step,
                               gather_s=gather_s)
    self.pool_pages = self.driver.engine.pages.num_pages - 1  # pages a sequence can use (the trash page aside)
    self.limits = Limits(self.context, self.slots, self.page_size, self.pool_pages, tuple(self.adapter_ids))
    self.eos_ids = self.driver.engine.eos_ids
    self._jobs: set = set()  # jobs with rows in the engine
    self._updates: queue.SimpleQueue = queue.SimpleQueue()  # lists of (row, seq, tokens, status) for the emitter
    self._batch: list = []  # the updates of the last chunk (engine thread only), handed over at the next dispatch
    self._emitter: threading.Thread | None = None
    self.after_emit: Callable | None = None  # called by the emitter after each chunk's events (`serve.split`)
    self._seen = (None, dict.fromkeys(COUNTERS + ("evictions",), 0))
    self.stats = {**dict.fromkeys(COUNTERS, 0), "max_active": 0, "generated_tokens": 0, "cancelled_rows": 0,
                  "errors": 0, "evictions": 0}

  # -- public, any thread ------------------------------------------------------------------------
  def submit(self, job: Job) -> None:
    """Queues the job's n completions: ValueError for an unknown adapter, a too-long request or one whose
    rows need more KV pages than the whole pool (`Limits.check`); `waiting.QueueFull` when the waiting
    queue is full. A job that waits longer than the queue's deadline ends with ("error", message, 503,
    retry_after)."""
    self.limits.check(job)
    job.texts = [""] * job.n
    try:
      self.waiting.enter(job, job.n, room=self.slots - self.active_rows(), final=False)
    except QueueFull:  # rows admitted since the last step's end wait no more: count again, once
      self._note_admitted()
      self.waiting.enter(job, job.n, room=self.slots - self.active_rows())
    self.driver.call(lambda engine: self._admit(engine, job))

  def cancel(self, job: Job) -> None:
    """Marks the job cancelled; its sequences leave the engine at the next step boundary."""
    job.cancelled = True
    self.waiting.left(job)
    self.driver.call(self._cancel_rows(job))

  def active_rows(self) -> int:
    """Sequences in the engine (prefilling or decoding)."""
    return len(self.driver.engine.live)

  def num_waiting(self) -> int:
    """Rows of the requests not yet admitted (queued for the engine thread or waiting for a row)."""
    return self.waiting.rows

  def state(self) -> dict:
    """/health's and /metrics' view of the engine now: active_rows, waiting, the `COUNTERS` since the start,
    compiles and compile_s (`compile_totals`), "metrics": `serve.metrics.snapshot`, "threads": {thread name:
    native id} and "processes": {"": pid} of this process (a name "p:thread" is a thread of processes[p])."""
    count, seconds = self.compile_totals()
    return {"active_rows": self.active_rows(), "waiting": self.num_waiting(),
            **{k: self.stats[k] for k in COUNTERS}, "compiles": count, "compile_s": seconds,
            "metrics": snapshot(self), "threads": {t.name: t.native_id for t in threading.enumerate()},
            "processes": {"": os.getpid()}}

  def warm_up(self, threads: int | None = None) -> tuple[int, float, int]:
    """(programs built, seconds, XLA backend compiles): every program the engine can meet serving requests
    of up to `context` positions (`fineflax.engine.Engine.warm_up`: decode chunks for every row bucket, table
    width and sampling filter, the prefills of the interleaved scheduler, page copies); a program found in
    the persistent compilation cache is built without a backend compile. Call before `start`."""
    t0, counter = time.perf_counter(), compiles.CompileCounter()
    n = self.driver.engine.warm_up(self.context, threads=threads)
    return n, time.perf_counter() - t0, counter.count

  @staticmethod
  def compile_totals() -> tuple[int, float]:
    """(XLA backend compiles, their seconds) of this process since the first server engine was made."""
    return compiles.totals()

  def on_emitter_thread(self) -> bool:
    """Whether the caller is the emitter thread (where `after_emit` follows a chunk's events)."""
    return self._emitter is not None and threading.current_thread() is self._emitter

  def start(self) -> "Engine":
    if self._emitter is None:
      self._emitter = threading.Thread(target=self._emit_loop, name="fineflax-emit", daemon=True)
      self._emitter.start()
    self.driver.start()
    return self

  def stop(self) -> None:
    self.driver.stop()
    if self._emitter is not None:
      self._updates.put(None)
      self._emitter.join(timeout=30)
      self._emitter = None

  # -- engine thread -----------------------------------------------------------------------------
  def _admit(self, engine: CoreEngine, job: Job) -> None:
    if job.cancelled:
      return
    try:
      stop = tuple(job.stop)
      for s in stop:
        if not isinstance(s, str):
          raise TypeError(f"stop={job.stop!r}: stop strings must be str, got {type(s).__name__}")
      seed = job.seed if job.seed is not None else int.from_bytes(os.urandom(8), "little")
      keys = row_keys(seed, job.n, wide=True)  # fold_in(key of all 64 bits of the seed, i), no device call
      adapter = self.adapter_ids[job.adapter] if job.adapter is not None else None
      job.rows = [_Row(job, i, stream=StreamText(self._decode)) for i in range(job.n)]
      requests = [Request(job.prompt, max_new_tokens=job.max_tokens, temperature=job.temperature,
                          top_p=job.top_p, key=keys[i], eos_ids=() if job.ignore_eos else None,
                          stop_strings=tuple(s for s in stop if s), adapter=adapter,
                          on_update=lambda seq, row=row: self._batch.append((row, seq, len(seq.tokens), seq.status)))
                  for i, row in enumerate(job.rows)]
      for lo in range(0, job.n, self.slots):
        for row, seq in zip(job.rows[lo:lo + self.slots], engine.submit_group(requests[lo:lo + self.slots])):
          row.seq = seq
      self._jobs.add(job)
    except Exception as e:
      self._fail(engine, job, e)

  def _after_step(self, engine: CoreEngine) -> None:
    if not self._sync_stats(engine)["decode_calls"]:  # this step made no decode call: no dispatch handed them over
      self._hand_over()
    self._check_waiting(engine)

  def _hand_over(self) -> None:
    """Gives the emitter the updates noted since the last hand-over. The engine calls it right before a decode
    chunk's device call (`before_decode_call`), which returns with the chunk and releases the GIL meanwhile: the
    emitter and the event loop then turn the last chunk's tokens into events while the device computes, instead
    of contending for the GIL with the engine's own host work between chunks (admission, prefill, the next
    chunk's inputs). A step without a decode call hands them over at its end."""
    if self._batch:
      batch, self._batch = self._batch, []
      self._updates.put(batch)

  def _note_admitted(self) -> None:
    """Waiting jobs with a row admitted leave the queue (their wait recorded). Any thread: it reads the
    rows' statuses, which only the engine thread writes."""
    for job in self.waiting.jobs():
      if any(r.seq is not None and r.seq.status != "waiting" for r in job.rows):
        self.waiting.admitted(job)

  def _check_waiting(self, engine: CoreEngine) -> None:
    """`_note_admitted`; the jobs past the deadline are refused: their rows are cancelled and they end with
    ("error", message, 503, retry_after)."""
    self._note_admitted()
    for job in self.waiting.expired():
      job.cancelled = True
      self._cancel_rows(job)(engine)
      try:
        job.emit(("error", f"the request waited more than {self.waiting.timeout_s:g} s for a decode slot "
                  "(--queue-timeout); the server is overloaded, retry later", 503, self.waiting.retry_after()))
      except Exception:  # the client is gone: nothing to tell
        traceback.print_exc()

  # -- emitter thread ----------------------------------------------------------------------------
  def _emit_loop(self) -> None:
    while (batch := self._updates.get()) is not None:
      for item in batch:
        self._update(*item)
      if self.after_emit is not None:
        self.after_emit()

  def _update(self, row: _Row, seq, ntok: int, status: str) -> None:
    """After a chunk: the sequence's first `ntok` tokens (its length then; `status` its status then) and
    their text to its job; its end. A sequence's tokens only grow after it was noted (a stop string's cut
    falls after the tokens of earlier chunks), so reading them here, while the next chunk runs, is safe."""
    job = row.job
    if row.done or job.cancelled or seq.status == "cancelled":
      return
    finished = status in FINISHED
    try:
      self.stats["generated_tokens"] += ntok - row.logged
      hit = self._emit_text(row, seq, ntok, final=finished)
      if hit and not finished:  # the text holds a stop string the engine's cut did not see
        self.driver.call(lambda engine: engine.cancel(seq))
      if finished or hit:
        row.done = True
        reason = "stop" if hit or status in ("eos", "stop") else "length"
        job.emit(("done", row.index, reason, ntok))
        if all(r.done for r in job.rows):
          self._jobs.discard(job)
    except Exception as e:  # this job fails, the batch goes on
      self._fail(None, job, e)

  def _emit_text(self, row: _Row, seq, ntok: int, final: bool) -> bool:
    """Emits the row's new text; True when a stop string ended it (the text is cut before it). The text
    grows by the decoded new tokens only (`engine.detok.StreamText`: incomplete characters wait); a stop
    string is looked for where it could end in the new text; the last len(longest stop) - 1 characters
    wait while they might start one."""
    job = row.job
    new = seq.tokens[row.fed:ntok]
    row.fed = ntok
    if not job.ignore_eos:
      new = [t for t in new if t not in self.eos_ids]
    old = len(row.text)
    row.text += row.stream.add(new) + (row.stream.flush() if final else "")
    text, stops = row.text, [s for s in job.stop if s]  # an empty stop string stops nothing
    found = [i for i in (text.find(s, max(0, old - len(s) + 1)) for s in stops) if i >= 0]
    if found:
      end, hit = min(found), True
    else:
      hold = max((len(s) - 1 for s in stops), default=0)
      end, hit = len(text) if final else len(text) - hold, False
    if end > row.sent or hit or final:
      delta = text[row.sent:end] if end > row.sent else ""
      entries = [(t, lp) for t, lp in zip(seq.tokens[row.logged:ntok], seq.raw_logprobs[row.logged:ntok])
                 if job.ignore_eos or t not in self.eos_ids]  # the end token is not content (OpenAI)
      row.logged = ntok
      row.sent = max(row.sent, end)
      if delta or entries:
        job.emit(("delta", row.index, delta, entries))
    job.texts[row.index] = text[:row.sent]
    return hit

  def _fail(self, engine: CoreEngine | None, job: Job, e: Exception) -> None:
    """Ends `job` with an error event; its sequences are cancelled (now on the engine thread, `engine`; from
    another thread, None: at the engine thread's next step)."""
    self.stats["errors"] += 1
    traceback.print_exc()
    self.waiting.left(job)
    if job.cancelled:
      return
    job.cancelled = True
    if engine is None:
      self.driver.call(self._cancel_rows(job))
    else:
      self._cancel_rows(job)(engine)
    try:
      job.emit(("error", f"request failed: {type(e).__name__}: {e}"))
    except Exception:  # the client is gone: nothing to tell
      traceback.print_exc()

  def _cancel_rows(self, job: Job):
    def cancel(engine):
      for row in job.rows:
        if row.seq is not None and not row.seq.finished:
          engine.cancel(row.seq)
          self.stats["cancelled_rows"] += 1
      self._jobs.discard(job)
    return cancel

  def _engine_failed(self, engine: CoreEngine, e: Exception) -> None:
    self.stats["errors"] += 1
    jobs, self._jobs, self._batch = self._jobs, set(), []
    for job in jobs:
      job.cancelled = True
      self.waiting.left(job)
      try:
        job.emit(("error", f"engine error: {type(e).__name__}: {e}"))
      except Exception:
        traceback.print_exc()

  def _sync_stats(self, engine: CoreEngine) -> dict:
    """Adds the core engine's new counts to `stats` (a rebuilt engine counts from 0 again); returns them."""
    if self._seen[0] is not engine:
      self._seen = (engine, dict.fromkeys(COUNTERS + ("evictions",), 0))
    seen, now = self._seen[1], {**{k: engine.stats[k] for k in COUNTERS}, "evictions": engine.pages.evicted}
    new = {k: v - seen[k] for k, v in now.items()}
    for k, v in new.items():
      self.stats[k] += v
    seen.update(now)
    self.stats["max_active"] = max(self.stats["max_active"], engine.stats["peak_rows"])
    return new
