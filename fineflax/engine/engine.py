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
from typing import Callable, Sequence as Seq

import jax
import jax.numpy as jnp

from fineflax.engine import device, tensor_parallel as tp
from fineflax.engine.adapters import stack_adapters
from fineflax.engine.attention import resolve_attention
from fineflax.engine.calls import DeviceCalls
from fineflax.engine.decode import decode_impl, prepare_decode_params, resolve_eos_ids
from fineflax.engine.detok import text_decoder
from fineflax.engine.pages import PageAllocator
from fineflax.engine.programs import CompiledPrograms, signature_shapes
from fineflax.engine.prompts import check_ids
from fineflax.engine.schedule import ADMISSIONS, Scheduler
from fineflax.engine.sequence import FINISHED, Request, Sequence, key_data  # noqa: F401 (FINISHED: serve's)


class Engine(Scheduler, DeviceCalls, CompiledPrograms):
  """Host driver of the paged-cache device functions (see the module docstring): the public API and the
  step's order here, admission and preemption in `Scheduler`, the device calls in `DeviceCalls`, their
  compiled programs in `CompiledPrograms`."""

  def __init__(self, params, config, *, max_rows: int, num_pages: int, page_size: int = 16,
               chunk_size: int = 32, prefill_chunk: int = 512, prefill_tokens: int = 16384,
               max_pages_per_row: int | None = None, tokenizer=None, eos_ids: Seq[int] | None = None,
               lora=None, lora_scale: float = 1.0, adapters=None, dtype=jnp.bfloat16,
               impl: str | None = "auto", attention: str = "auto", dense_base: bool = False,
               prepared: bool = False, min_row_bucket: int | None = None, interleave_prefill: bool = False,
               prefix_cache: bool = False, prefill_full_table: bool = False, coarse_buckets: bool = False,
               mesh=None, admission: str = "watermark", watermark: float = 0.01,
               before_decode_call: Callable[[], None] | None = None):
    """num_pages: pages in the pool (page 0 is the trash page); page_size tokens each. impl: the decoder
    ("unrolled" | "scan"; "auto" as `engine.decode.decode_impl`). attention: the decode attention over
    pages, "gather" | "pallas" | "paged_decode" | a `DecodeKernel` | "auto" (`engine.attention`: the
    environment variable FINEFLAX_PAGED_ATTENTION if set, else "paged_decode" on GPUs, "gather" elsewhere);
    prefill always gathers. chunk_size: decode steps per device call; prefill_chunk: prompt
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
    flight when rows end early). before_decode_call(): run on the engine's thread right before each decode
    chunk's device call; that call returns with the chunk (XLA's GPU while loop reads its predicate on the host,
    the GIL released), so host work another thread is handed here overlaps the device (a server's streams)."""
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
    self._text = text_decoder(tokenizer) if tokenizer is not None else None  # ids -> text, no special tokens
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
    self.attention = resolve_attention(attention, config, int(page_size), self.mesh)
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
                  "preemptions": 0, "recomputed_tokens": 0,
                  # decode calls: seconds in the call, then awaiting its results; host seconds between one call's
                  # results and the next call (gaps: how many such gaps, while decoding went on)
                  "dispatch_s": 0.0, "wait_s": 0.0, "gap_s": 0.0, "gaps": 0}
    self._decode_end = None  # perf_counter() when the last decode call's results arrived (None: paused)
    self.before_decode_call = before_decode_call

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
      seq = Sequence(self._next_id, request, list(prompt), key_data(request.key), eos,
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


def default_min_row_bucket(backend: str | None = None) -> int:
  """8 on accelerators (a decode step of up to 8 rows reads the same weights in about the same time: rows
  1, 2, 4 and 8 share one program), 1 on CPU (compute-bound: padding rows cost their share)."""
  return 1 if (backend or jax.default_backend()) == "cpu" else 8
