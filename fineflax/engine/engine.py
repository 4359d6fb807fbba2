"""The generation engine: continuous batching of sequences over one paged KV cache.

    engine = Engine(params, config, max_rows=64, num_pages=4096, tokenizer=tok, dtype=jnp.bfloat16)
    seq = engine.submit(Request(prompt_ids, max_new_tokens=512, temperature=1.0, key=jax.random.key(0)))
    group = engine.submit(Request(prompt_ids, max_new_tokens=512, temperature=1.0, key=k), n=8)
    engine.run()                        # steps until no sequence has work left
    seq.tokens, seq.raw_logprobs, seq.status

A step (`step`), all decisions on the host between device calls:
  1. admission: waiting requests (first come, first served; a group of n samples as one unit; preempted
     rows first) become live sequences while at most `max_rows` are live and the free pages cover, with
     admission="watermark" (default, as vLLM), what every live sequence and the group take up to the end of
     their next decode chunk plus a watermark of free pages; with admission="reserve", what every live
     sequence may still need (its prompt plus its whole reserve: no preemption, fewer rows in flight);
  2. prefill: live sequences with tokens not yet in the cache (a new prompt, tool output appended with
     `append`) feed up to `prefill_chunk` of them each (a long prompt takes several steps; while other
     rows decode, or always with `interleave_prefill`, at most `prefill_tokens` tokens a step, so decoding
     rows keep going between blocks); a
     group's first sequence prefills the prompt once, the other n - 1 then share its pages
     (`PageAllocator.fork`; the shared partial page is copied on write);
  before each prefill or decode call, when the pages it takes are not free, the newest live rows with
  work are preempted: their pages freed, they wait at the head of the queue and recompute their prompt and
  tokens by prefill when they enter again (tokens and sampling unchanged: token t of a row is drawn with
  fold_in(key, t); `stats["preemptions"]`, `stats["recomputed_tokens"]`);
  3. decode: one chunk of up to `chunk_size` steps on the device (`device.decode_chunk`, lax.while_loop,
     no Python per token) for the rows with a budget, packed into a compact batch (rows bucketed to a
     power of two, pages read per row bucketed to the longest row: cost follows the live tokens);
  4. host: tokens appended, stop strings cut (shortest prefix whose text holds one; the cache is cut
     back to it), finished sequences release their pages unless `hold`, `on_update` callbacks stream.

Sequences and sampling parameters are per row (arrays on the device): temperature (0 = greedy), top_k,
top_p, key (token t of a sequence is drawn with fold_in(key, t): its samples do not depend on the rows
beside it), eos ids, max_new_tokens, and the LoRA adapter: `Engine(adapters=[(lora, scale), ...])` stacks
them (`engine.adapters`) and `Request(adapter=i)` picks one per row (None: the base), rows of different
adapters sharing a device call (the server's multi-LoRA); `Engine(lora=...)` applies one adapter to all.
`Engine(prefix_cache=True)` (the server's): the full pages of every prefilled prompt stay cached (per
adapter, least recently used evicted when the pool needs pages: `PageAllocator.match_prefix`); a prompt
about to prefill starts with the cached pages of its longest cached prefix and prefills only the rest.
On a mesh of one process, `fineflax.sampling` with cache="replicas" runs one engine per device, rows split
over them, and on a data x model mesh one tensor-parallel engine per group of the model axis's devices
(`sampling.replicas`). `Engine(mesh=make_mesh(model=N))`: tensor-parallel decoding, the weights,
adapters and page pool split over the mesh's "model" axis (`engine.tensor_parallel`); the host side is
unchanged.

For a server: `submit` may be called between steps at any time (one thread drives the engine, others hand it
work: `engine.driver.EngineThread`, used by `fineflax.serve` and `fineflax.agents.LocalLLM`), `on_update(seq)`
streams tokens after each chunk, `cancel(seq)` frees a sequence's row and pages at the next step boundary.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable, Sequence as Seq

import jax
import jax.numpy as jnp
import numpy as np

from fineflax.engine import device, tensor_parallel as tp
from fineflax.engine.adapters import row_weights, stack_adapters
from fineflax.engine.pages import PageAllocator, pages_for
from fineflax.models.paged import PAGED_KERNELS, pallas_available
from fineflax.engine.decode import bucket, decode_impl, prepare_decode_params, resolve_eos_ids
from fineflax.engine.processors import RowFilters
from fineflax.engine.programs import CompiledPrograms, signature_shapes
from fineflax.engine.prompts import check_ids
from fineflax.engine.stops import stop_cut

FINISHED = ("eos", "stop", "length", "cancelled")
ADMISSIONS = ("watermark", "reserve")
MIN_READ_TOKENS = 128  # block tables are at least this many tokens wide (fewer compiled programs)


@dataclasses.dataclass
class Request:
  """One prompt to continue. max_new_tokens: tokens the first decode may generate (0 with hold=True:
  prefill only, `Engine.resume` gives budgets later). reserve: completion tokens (generated and appended)
  the sequence may ever hold, default max_new_tokens (pages are reserved for prompt + reserve).
  key: a PRNG key (typed or raw uint32[2], threefry), needed when temperature > 0. eos_ids None: the
  engine's. hold: keep the sequence and its pages after it finishes (for `append` / `resume`; `release`
  frees it). on_update(seq): called after each step in which the sequence got tokens or finished.
  adapter: index into the engine's `adapters` (None: the base, or the engine's one `lora`)."""
  prompt: Seq[int]
  max_new_tokens: int
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  key: object = None
  eos_ids: Seq[int] | None = None
  stop_strings: Seq[str] = ()
  reserve: int | None = None
  hold: bool = False
  on_update: Callable | None = None
  adapter: int | None = None


@dataclasses.dataclass(eq=False)
class Sequence:
  """A request's state. tokens / logprobs / raw_logprobs / model: the completion so far (model False for
  appended tokens, whose log-probs are 0); status: waiting | prefill | fork (waits for its group's prompt)
  | ready (decodes while budget > 0) | eos | stop | length | cancelled."""
  id: int
  request: Request
  prompt: list
  key: np.ndarray
  eos: tuple
  tokens: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  raw_logprobs: list = dataclasses.field(default_factory=list)
  model: list = dataclasses.field(default_factory=list)
  status: str = "waiting"
  budget: int = 0
  cache_len: int = 0  # positions in the cache
  count: int = 0  # tokens sampled so far (the key's counter)
  seg_start: int = 0  # start of the current model segment (stop strings look at it only)
  excess_chars: int = 0  # text past the stop string's end inside the last token
  stop_strings: tuple = ()
  leader: "Sequence | None" = None  # group member: shares this sequence's prompt pages
  followers: list = dataclasses.field(default_factory=list)
  preemptions: int = 0  # times its pages were freed to be recomputed (admission="watermark")

  @property
  def prompt_len(self) -> int:
    return len(self.prompt)

  @property
  def full(self) -> list:
    return self.prompt + self.tokens

  @property
  def max_len(self) -> int:
    """Positions the sequence may ever reach: prompt + reserve."""
    r = self.request
    return len(self.prompt) + (r.max_new_tokens if r.reserve is None else r.reserve)

  @property
  def room(self) -> int:
    return self.max_len - len(self.full)

  @property
  def finished(self) -> bool:
    return self.status in FINISHED


class Engine(CompiledPrograms):
  """Host driver of the paged-cache device functions (see the module docstring)."""

  def __init__(self, params, config, *, max_rows: int, num_pages: int, page_size: int = 16,
               chunk_size: int = 32, prefill_chunk: int = 512, prefill_tokens: int = 16384,
               max_pages_per_row: int | None = None, tokenizer=None, eos_ids: Seq[int] | None = None,
               lora=None, lora_scale: float = 1.0, adapters=None, dtype=jnp.bfloat16,
               impl: str | None = "auto", attention: str = "auto", dense_base: bool = False,
               prepared: bool = False, min_row_bucket: int | None = None, interleave_prefill: bool = False,
               prefix_cache: bool = False, prefill_full_table: bool = False, coarse_buckets: bool = False,
               mesh=None, admission: str = "watermark", watermark: float = 0.01):
    """num_pages: pages in the pool (page 0 is the trash page); page_size tokens each. impl: the decoder
    ("unrolled" | "scan"; "auto" as `engine.decode.decode_impl`). attention: the decode attention over
    pages, "gather" | "pallas" | "auto" (= environment variable FINEFLAX_PAGED_ATTENTION if set, else
    "gather"); prefill always gathers. chunk_size: decode steps per device call; prefill_chunk: prompt
    tokens a row feeds per step; prefill_tokens: rows x block tokens of one prefill call at most.
    prepared=True: `params` come from `engine.decode.prepare_decode_params` for this impl already.
    lora / lora_scale: one adapter for every row; adapters: [(lora, scale), ...] chosen per row by
    `Request.adapter` (`engine.adapters.stack_adapters`); not both. min_row_bucket: device calls run at
    least this many rows (padding rows cost nothing where a step reads the weights anyway; fewer row
    buckets, fewer compiled programs); None: `default_min_row_bucket()`. interleave_prefill=True: at most
    one prefill call (<= prefill_tokens) a step even when no row decodes, so the first admitted rows decode
    after one prefill call instead of after every waiting prompt's (a server's time to first token; a
    batch job that admits everything at once prefills fastest with False). prefix_cache=True: the full
    pages of every prefilled prompt stay in the allocator's prefix cache (per LoRA adapter) until the pool
    needs them; a new prompt starts with the cached pages of its longest cached prefix and prefills the
    rest (`stats["prefix_hit_tokens"]`). prefill_full_table=True: prefill calls read block tables as wide as
    a row may grow (not the page bucket of the batch's longest sequence): one prefill program per (rows,
    block width) instead of per (rows, block width, table width), the server's choice (`warm_up` compiles
    them all; a prefill reads more padding pages, a few per row). coarse_buckets=True: device calls round
    rows up to min_row_bucket x 4^k (not 2^k) and block tables to 2^k pages (not 2^k or 3 x 2^(k-1)): fewer
    programs to compile for more padding (the server's). mesh: a mesh with a "model" axis of N > 1 devices
    decodes tensor-parallel over it (`engine.tensor_parallel`; heads, kv heads and intermediate size divisible
    by N; with prepared=True the params must be prepared with fuse=False). admission: "watermark" (a group
    enters when the pages its rows take up to the end of their first decode chunk, plus those every live
    row takes in its next chunk, plus `watermark` x the pool, are free; rows grow a chunk at a time and the
    newest are preempted and recomputed when the pool runs dry: `engine.schedule`) or "reserve" (a group
    enters when the pool covers every live row's prompt + whole reserve: never preempts, fewer rows in
    flight when rows end early)."""
    if max_rows < 1:
      raise ValueError(f"max_rows={max_rows}: must be >= 1")
    if admission not in ADMISSIONS:
      raise ValueError(f"admission={admission!r}; choose one of {ADMISSIONS}")
    if not 0 <= watermark < 1:
      raise ValueError(f"watermark={watermark}: a fraction of the pool in [0, 1)")
    self.impl = decode_impl(impl)
    self.mesh = mesh if tp.tp_size(mesh) > 1 else None
    if self.mesh is not None:
      tp.check_tp(config, tp.tp_size(mesh))
    self.params = params if prepared else prepare_decode_params(params, config, self.impl, dtype, dense_base,
                                                                fuse=self.mesh is None)
    self.config, self.tokenizer, self.dtype = config, tokenizer, dtype
    self.lora, self.lora_scale = lora, jnp.asarray(lora_scale, jnp.float32)
    self.adapter_scales = None  # per-row adapters: scale of each stacked adapter
    if adapters:
      if lora is not None:
        raise ValueError("Engine(lora=..., adapters=...): pass one adapter for all rows or per-row adapters")
      self.lora, self.adapter_scales = stack_adapters(adapters, config)
    self._pool_sharding = None
    if self.mesh is not None:
      self.params = tp.shard_decode_params(self.params, config, self.mesh)
      self.lora = tp.shard_lora(self.lora, self.mesh)
      self.lora_scale = self._put(self.lora_scale)
      self._pool_sharding = tp.pool_sharding(self.mesh)
    attention = os.environ.get("FINEFLAX_PAGED_ATTENTION", "gather") if attention == "auto" else attention
    if attention not in PAGED_KERNELS:
      raise ValueError(f"attention={attention!r}; choose one of {PAGED_KERNELS} or 'auto'")
    if attention == "pallas" and not pallas_available():
      raise ValueError("attention='pallas': this jax has no jax.experimental.pallas.ops.gpu.paged_attention")
    if attention == "pallas" and self.mesh is not None:
      raise ValueError("attention='pallas' with tensor parallelism (a mesh with a model axis): the Pallas kernel "
                       "is not partitioned over kv heads yet; use attention='gather'")
    self.attention = attention
    self.max_rows, self.page_size = int(max_rows), int(page_size)
    floor = default_min_row_bucket() if min_row_bucket is None else int(min_row_bucket)
    self.min_row_bucket = min(max(floor, 1), device.row_bucket(self.max_rows))
    self.chunk_size, self.prefill_chunk = int(chunk_size), int(prefill_chunk)
    self.prefill_tokens = max(int(prefill_tokens), self.prefill_chunk)
    self.interleave_prefill, self.prefix_cache = bool(interleave_prefill), bool(prefix_cache)
    self.prefill_full_table, self.coarse_buckets = bool(prefill_full_table), bool(coarse_buckets)
    self.max_pages_per_row = max_pages_per_row
    self.eos_ids = resolve_eos_ids(eos_ids, config, tokenizer)
    self.pages = PageAllocator(num_pages, page_size)
    self.admission = admission
    self.watermark_pages = math.ceil(watermark * (self.pages.num_pages - 1))
    if self.mesh is None:
      self.pool = device.new_pool(config, int(num_pages), self.page_size, dtype)
    else:
      self.pool = tp.new_pool(config, int(num_pages), self.page_size, dtype, self.mesh)
    self._signature = (config, jnp.dtype(dtype).name, self.impl, self.attention, self.chunk_size,
                       signature_shapes(self.params), signature_shapes(self.pool), signature_shapes(self.lora),
                       tuple(jax.tree.leaves(self.pool)[0].devices()),  # a program runs on its pool's device
                       self.mesh)
    self.programs: set = set()  # keys of the compiled decode programs this engine used
    self.waiting: list[list[Sequence]] = []  # groups, first come first served
    self.live: list[Sequence] = []
    self._next_id = 0
    self.stats = {"prefill_tokens": 0, "prefix_hit_tokens": 0, "prefill_calls": 0, "decode_calls": 0,
                  "decode_steps": 0, "copied_pages": 0, "peak_pages": 0, "peak_rows": 0, "decode_rows": 0, "mixed_adapter_calls": 0,
                  "preemptions": 0, "recomputed_tokens": 0}

  # ----------------------------------------------------------------------------------------------
  def submit(self, request: Request, n: int = 1) -> Sequence | list[Sequence]:
    """Queues `request`; returns its Sequence. n > 1: n samples (keys fold_in(key, i)) sharing the
    prompt's pages (`submit_group`), returned as a list."""
    if n == 1:
      return self.submit_group([request])[0]
    key = request.key
    return self.submit_group([dataclasses.replace(request, key=None if key is None else jax.random.fold_in(key, i))
                              for i in range(n)])

  def submit_group(self, requests: Seq[Request]) -> list[Sequence]:
    """Queues requests with one prompt (each with its own settings and key) as one unit: the prompt is
    prefilled once, by the first, and its pages shared by all (copy on write of the partial last page)."""
    prompt = [int(t) for t in requests[0].prompt]
    if not prompt:
      raise ValueError("submit(): the prompt is empty")
    check_ids(prompt, self.config.vocab_size, "prompt")
    if not 1 <= len(requests) <= self.max_rows:
      raise ValueError(f"a group of {len(requests)} must fit the engine's max_rows={self.max_rows}")
    group = []
    for request in requests:
      if [int(t) for t in request.prompt] != prompt:
        raise ValueError("submit_group(): the requests' prompts differ")
      if request.max_new_tokens < 0 or (request.max_new_tokens == 0 and not request.hold):
        raise ValueError(f"max_new_tokens={request.max_new_tokens}: must be >= 1 (0 only with hold=True)")
      if request.temperature > 0 and request.key is None:
        raise ValueError(f"temperature={request.temperature} samples: pass Request(key=jax.random.key(...))")
      if request.adapter != requests[0].adapter:
        raise ValueError("submit_group(): the requests' adapters differ (a group shares its prompt's cache)")
      if request.adapter is not None and not (self.adapter_scales is not None
                                              and 0 <= request.adapter < len(self.adapter_scales)):
        have = 0 if self.adapter_scales is None else len(self.adapter_scales)
        raise ValueError(f"adapter={request.adapter!r}: the engine serves {have} per-row adapters "
                         "(Engine(adapters=[...]), indices 0 ..)")
      if request.stop_strings and self.tokenizer is None:
        raise ValueError(f"stop_strings={tuple(request.stop_strings)} need a tokenizer (Engine(tokenizer=...))")
      eos = self.eos_ids if request.eos_ids is None else tuple(int(t) for t in request.eos_ids)
      seq = Sequence(self._next_id, request, list(prompt), _key_data(request.key), eos,
                     budget=int(request.max_new_tokens), stop_strings=tuple(s for s in request.stop_strings if s))
      self._next_id += 1
      if seq.max_len > self._row_limit():
        raise ValueError(f"prompt ({len(prompt)} tokens) + reserve exceed a row's {self._row_limit()} "
                         "positions (max_pages_per_row x page_size)")
      if group:
        seq.leader = group[0]
        group[0].followers.append(seq)
      group.append(seq)
    self.waiting.append(list(group))
    return group

  def append(self, seq: Sequence, tokens: Seq[int]) -> None:
    """Tool output after a finished, held sequence: fed into the cache (prefill), not generated (model
    False, log-prob 0); the sequence becomes ready with budget 0 (`resume` gives it one)."""
    tokens = [int(t) for t in tokens]
    if not tokens:
      return
    if not seq.request.hold or seq not in self.live:
      raise ValueError(f"append(): sequence {seq.id} is not a live held sequence")
    check_ids(tokens, self.config.vocab_size, "append")
    if len(tokens) > seq.room:
      raise ValueError(f"append(): {len(tokens)} tokens do not fit: {seq.room} positions of the sequence's "
                       "reserve left; raise the reserve (max_total_len)")
    seq.tokens += tokens
    seq.logprobs += [0.0] * len(tokens)
    seq.raw_logprobs += [0.0] * len(tokens)
    seq.model += [False] * len(tokens)
    seq.seg_start, seq.excess_chars, seq.budget = len(seq.tokens), 0, 0
    seq.status = "prefill"

  def resume(self, seq: Sequence, max_new_tokens: int, stop_strings: Seq[str] = ()) -> None:
    """Gives a live sequence that is not finished a decode budget (capped by its reserve: "length" when
    nothing is left) and the stop strings of this turn."""
    if seq.finished:
      return
    seq.stop_strings = tuple(s for s in stop_strings if s)
    seq.budget = min(int(max_new_tokens), seq.room)
    if seq.budget <= 0:
      seq.budget, seq.status = 0, "length"

  def cancel(self, seq: Sequence) -> None:
    """Stops a sequence now (between steps): its pages are released, status "cancelled"."""
    for group in self.waiting:
      if seq in group:
        group.remove(seq)
        if seq.leader is None and group:  # the next member prefills the group's prompt instead
          group[0].leader, group[0].followers = None, group[1:]
          for f in group[1:]:
            f.leader = group[0]
    self.waiting = [g for g in self.waiting if g]
    if seq in self.live:
      self._hand_over(seq)
      self._finish(seq, "cancelled", force_release=True)
    else:
      seq.status = "cancelled"

  def _hand_over(self, seq: Sequence) -> None:
    """Before a live leader leaves: its first follower still waiting for the prompt becomes the group's
    leader, holding the pages prefilled so far (they hold the same prompt's KV) and prefilling the rest;
    the other waiting followers wait for it. The group's pages stay what admission counted (before, each
    waiting follower prefilled the whole prompt itself into pages no one had counted: OutOfPages)."""
    waiting = [f for f in seq.followers if f.status == "fork"]
    if not waiting:
      return
    heir = waiting[0]
    self.pages.fork(seq.id, heir.id, seq.cache_len)
    heir.leader, heir.followers, heir.status, heir.cache_len = None, waiting[1:], "prefill", seq.cache_len
    for f in waiting[1:]:
      f.leader = heir
    seq.followers = [f for f in seq.followers if f not in waiting]

  def release(self, seq: Sequence) -> None:
    """Frees a held sequence's pages and row."""
    if seq in self.live:
      self.live.remove(seq)
      if seq.id in self.pages.tables:
        self.pages.release(seq.id)

  def run(self) -> None:
    """Steps until no sequence has work left (prefill or a decode budget) and none waits."""
    while self.step():
      pass
    if self.waiting:
      raise RuntimeError(f"{len(self.waiting)} requests wait for rows that never free up: all "
                         f"{len(self.live)} live sequences are held (release them) or max_rows is too small")

  def step(self) -> bool:
    """One engine step (module docstring); False when it did nothing."""
    self._admit()
    did = self._prefill()
    return self._decode() or did

  # ----------------------------------------------------------------------------------------------
  def _row_limit(self) -> int:
    return (self.max_pages_per_row or self.pages.num_pages - 1) * self.page_size

  def _outstanding(self, seq: Sequence) -> int:
    """Pages `seq` may still take from the free list to reach its max_len (copies on write included).
    A group shares its prompt's full pages: the followers never take those; whoever writes into the
    shared partial page first takes a copy of it (the last holder writes the original)."""
    size, table = pages_for(seq.max_len, self.page_size), self.pages.tables.get(seq.id)
    shared_full = (len(seq.prompt) - 1) // self.page_size
    partial = (len(seq.prompt) - 1) % self.page_size != 0
    if seq.leader is not None and seq.status in ("waiting", "fork"):
      return size - shared_full
    if table is None:  # waiting
      return size + int(partial and bool(seq.followers))
    forking = partial and any(f.status in ("waiting", "fork") for f in seq.followers)
    shared_tail = bool(table) and seq.cache_len % self.page_size != 0 and self.pages.refcount[table[-1]] > 1
    return max(size - len(table), 0) + int(shared_tail or forking)

  def _step_need(self, seq: Sequence) -> int:
    """Pages `seq` takes from the free list until the end of its next decode chunk (its prefill first:
    positions up to len(full) - 1 + min(budget, chunk_size)); a group's follower does not count the
    prompt's full pages it will share (a copy of the shared partial page counts). 0 for a row with no
    work (finished, or held with no budget)."""
    k = max(min(seq.budget, self.chunk_size), 0)
    if seq.status == "ready":
      return self.pages.pages_to_grow(seq.id, seq.cache_len + k) if k > 0 else 0
    if seq.status not in ("waiting", "prefill", "fork"):
      return 0
    table = self.pages.tables.get(seq.id)
    have = (len(seq.prompt) - 1) // self.page_size if seq.leader is not None else len(table or ())
    return max(pages_for(len(seq.full) - 1 + k, self.page_size) - have, 0)

  def _need(self, seq: Sequence) -> int:
    """The pages admission counts for `seq`: "reserve", its prompt + whole reserve (`_outstanding`);
    "watermark", its next chunk's (`_step_need`)."""
    return self._outstanding(seq) if self.admission == "reserve" else self._step_need(seq)

  def _admit(self) -> None:
    """Waiting groups enter, first come first served, while rows are free and the pages every live row
    and the group need (`_need`), plus `watermark_pages` with the watermark's rule, are free."""
    if not self.waiting:
      return
    committed = sum(self._need(s) for s in self.live)
    margin = self.watermark_pages if self.admission == "watermark" else 0
    while self.waiting:
      group = self.waiting[0]
      if len(self.live) + len(group) > self.max_rows:
        return
      need = sum(self._need(s) for s in group)
      if committed + need + margin > self.pages.num_free:
        if self.live:
          return
        if self.admission == "reserve":
          raise RuntimeError(f"a request needs {need} pages; the pool has {self.pages.num_free} free: raise "
                             "num_pages")
        # an empty engine takes the group: its first row fits the pool (submit checks), the others
        # are preempted until they fit
      committed += need
      self.waiting.pop(0)
      for s in group:
        if s.status == "cancelled":
          continue
        if s.leader is None:
          self.pages.new(s.id)
        s.status = "fork" if s.leader is not None else "prefill"
        self.live.append(s)

  def _make_room(self, plan: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
    """Preempts the newest live rows with work (`_preempt`) until the pages the rows of `plan` take to grow
    to their lengths (sequence, length) are free; returns the plan's rows still live. A row with no work
    (held, no budget) is never preempted: its pages are its owner's. With no row left to preempt, the
    plan is empty: the step does nothing and `run` names the held rows."""
    while True:
      plan = [(s, end) for s, end in plan if s.status != "waiting"]
      need = sum(self.pages.pages_to_grow(s.id, end) for s, end in plan)
      if need <= self.pages.num_free:
        return plan
      planned = {s.id for s, _ in plan}
      victim = next((s for s in reversed(self.live) if self._preemptible(s)
                     and (s.id in planned or self.pages.tables.get(s.id))), None)
      if victim is None:
        return []
      self._preempt(victim)

  def _preemptible(self, seq: Sequence) -> bool:
    """A live row with work: prefilling, or ready with a budget (a group's follower waiting for its
    leader's prompt holds no pages: it goes with its leader)."""
    return seq.status == "prefill" or (seq.status == "ready" and seq.budget > 0)

  def _preempt(self, seq: Sequence) -> None:
    """Frees `seq`'s pages and queues it ahead of new work to recompute its prompt and tokens (a prefill of
    full[:-1]); its followers that wait for its prompt go with it, those that share its pages already
    keep them. Tokens, budget and the key's counter are kept: the row continues where it stopped (token t
    is drawn with fold_in(key, t) whatever the row's history)."""
    group = [seq] + [f for f in seq.followers if f.status == "fork"]
    for f in seq.followers:
      if f.status != "fork":
        f.leader = None
    if seq.leader is not None:
      seq.leader.followers.remove(seq)
    seq.leader, seq.followers = None, group[1:]
    self.stats["preemptions"] += len(group)
    self.stats["recomputed_tokens"] += seq.cache_len
    if seq.id in self.pages.tables:
      self.pages.release(seq.id)
    for s in group:
      self.live.remove(s)
      s.status, s.cache_len = "waiting", 0
      s.preemptions += 1
    self.waiting.insert(0, group)

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
    self.pool, st, eos, out = program(self.params, self.pool, *self._put((table, state)), self.lora,
                                      self._scale(rows, b))
    st, eos, out = jax.device_get((st, eos, out))
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
    (`engine.stops.stop_cut`); True if cut. The cache is cut back to the kept tokens."""
    cut = stop_cut(s.tokens[s.seg_start:], s.stop_strings,
                   lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True))
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


def default_min_row_bucket(backend: str | None = None) -> int:
  """8 on accelerators (a decode step of up to 8 rows reads the same weights in about the same time: rows
  1, 2, 4 and 8 share one program), 1 on CPU (compute-bound: padding rows cost their share)."""
  return 1 if (backend or jax.default_backend()) == "cpu" else 8


def _key_data(key) -> np.ndarray:
  """uint32 [2] key data of a typed or raw threefry key (zeros for None: greedy rows draw nothing)."""
  if key is None:
    return np.zeros(2, np.uint32)
  if jnp.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  data = np.asarray(key, np.uint32)
  if data.shape != (2,):
    raise ValueError(f"key: expected a threefry key (uint32[2] data), got data of shape {data.shape}")
  return data
