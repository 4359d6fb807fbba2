"""SamplerSession: batched decoding with a persistent KV cache, stop strings and tool-output appends.

    s = SamplerSession(params, config, max_total_len=512, tokenizer=tok, temperature=1.0, rng=key)
    s.start(prompts)                                  # list of token lists (any lengths)
    s.decode(128, stop_strings=("</search>",))        # rows stop at EOS, a stop string or the budget
    s.append({0: passage_ids})                        # rows 0: tokens fed into the cache, mask 0
    s.decode(128, ...)                                # only rows given tokens continue
    out = s.result()                                  # SampleOutput over the whole completion

Row states: "ready" (will decode), "eos", "stop", "length" (finished; `append` makes a row ready again).
Stop strings are found on the host between jitted chunks of `chunk_size` steps, in the text decoded
(skip_special_tokens=True) from the row's current model segment (since `start` or the last `append`):
the row keeps the shortest token prefix whose text contains a stop string; `texts` end exactly at the
stop string's end; the cache is cut back to the kept tokens, so a later `append` continues exactly from
the kept text. Each row may hold max_total_len completion tokens (generated and appended).

Backed by the engine (`fineflax.engine`, cache="paged", the default): every row is a held sequence of
one paged KV cache; identical prompts are prefilled once and share their pages; decoding reads only the
live tokens. A paged session on a mesh of only a "model" axis (`make_mesh(data=1, model=N)`) decodes
tensor-parallel: one engine, weights and pages split over the axis (`engine.tensor_parallel`).
On a mesh of several devices of one process, rows split over its replicas, one engine and page pool each
(`replicas.ReplicaSession`): its devices for cache="replicas" (opt-in), its tensor-parallel groups for a
data x model mesh (`make_mesh(data=D / M, model=M)`, cache "paged" or "replicas": each group of M devices
one tensor-parallel engine; RL rollouts with config.mesh.model). cache="static" (and any other
session on a mesh of several devices) runs the static-cache session (`static_session.StaticSession`, one
cache slot index shared by every row, rows and cache split over the mesh). Row r samples with key fold_in(rng, r) (paged, on one device or
many: the same tokens either way) or one key per chunk (static): the same tokens under greedy decoding,
other draws when sampling.
"""
from __future__ import annotations

import threading
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp

from fineflax.engine import Engine, Request
from fineflax.engine.decode import decode_impl, prepare_decode_params
from fineflax.engine.device import geometric_bucket
from fineflax.engine.pages import pages_for
from fineflax.engine.processors import SamplingConfig
from fineflax.engine.tensor_parallel import tp_size
from fineflax.engine.prompts import checked_appends, checked_decode_args, checked_prompts, group_identical
from fineflax.sampling.output import SampleOutput, build_output
from fineflax.sampling.replicas import ReplicaSession, place_replica, replica_mesh, replicas_of

CACHES = ("paged", "static", "replicas")


def uses_static_cache(cache: str, mesh) -> bool:
  """Whether a session / generate call runs the static-cache path: cache="static", or a mesh of several
  devices, unless rows split over its replicas (`replicas.replicas_of`: cache="replicas" on one process's
  mesh, or a data x model mesh) or cache="paged" decodes tensor-parallel on a model-only mesh
  (`tensor_parallel_mesh`)."""
  if cache not in CACHES:
    raise ValueError(f"cache={cache!r}; choose one of {CACHES}")
  multi = mesh is not None and mesh.devices.size > 1
  return cache == "static" or (multi and not replicas_of(cache, mesh) and tensor_parallel_mesh(cache, mesh) is None)


def tensor_parallel_mesh(cache: str, mesh):
  """The mesh when a paged session decodes tensor-parallel on it as one engine (weights and pages split
  over its "model" axis: `engine.tensor_parallel`): cache "paged" or "replicas" and a mesh of only a "model"
  axis of > 1 devices; None otherwise (a data x model mesh of one process splits rows over its tensor-parallel
  groups: `replicas.replicas_of`). ValueError for a data x model mesh of several processes: not supported."""
  if cache not in ("paged", "replicas") or tp_size(mesh) < 2 or replicas_of(cache, mesh):
    return None
  if mesh.devices.size != tp_size(mesh):
    raise ValueError(f"tensor-parallel decoding: mesh {dict(mesh.shape)} also splits rows over "
                     f"{jax.process_count()} processes; use a mesh of the model axis only "
                     "(make_mesh(data=1, fsdp=1, model=N)) or one process")
  return mesh


_RECENT_POOLS: list[int] = []  # pool sizes of the latest engines, newest first (engine_pool_pages)
_RECENT_LOCK = threading.Lock()


def engine_pool_pages(lengths: Sequence[int], page_size: int, slack: float = 1.25) -> int:
  """Pool pages for sequences of at most these lengths decoded at once without sharing (each one page
  more for a copy on write, plus the trash page): the smallest of the last 8 sizes this process used that
  holds the need with at most `slack` x to spare, else the need rounded up to one of 8 sizes per doubling
  (`geometric_bucket`, at least 16). The pool's shape is part of every compiled program's signature: RL
  steps whose prompts differ a little keep one pool and their programs (before: a multiple of 256 pages,
  crossed from one step to the next by the prompts' lengths, and all programs compiled again)."""
  need = sum(pages_for(n, page_size) + 1 for n in lengths) + 1
  with _RECENT_LOCK:  # sessions of several devices start in threads (`replicas`)
    fits = [p for p in _RECENT_POOLS if need <= p <= slack * need]
    size = min(fits) if fits else geometric_bucket(max(need, 16), 8)
    if size in _RECENT_POOLS:
      _RECENT_POOLS.remove(size)
    _RECENT_POOLS.insert(0, size)
    del _RECENT_POOLS[8:]
  return size


class SamplerSession:
  """The session of the module docstring; keyword arguments as `generate`'s, plus max_total_len (completion
  tokens a row may hold) and cache / page_size / attention (the engine's, see `fineflax.engine.Engine`)."""

  def __init__(self, params, config, *, max_total_len: int, tokenizer=None, temperature: float = 1.0,
               top_k: int = 0, top_p: float = 1.0, eos_ids: Sequence[int] | None = None, rng=None,
               lora=None, lora_scale: float = 1.0, dtype=jnp.bfloat16, chunk_size: int = 32, mesh=None,
               impl: str | None = "auto", dense_base: bool = False, cache: str = "paged",
               page_size: int = 16, attention: str = "auto"):
    """impl: the decoder (see `decode_impl`; "auto": "unrolled" on GPUs, else "scan"). "unrolled"
    re-lays the weights out once here (`prepare_unrolled`): an extra copy of the dense weights while the
    session lives. dense_base=True decodes a quantised base from a `dtype` copy of its dequantised
    weights made here (same weights; NF4 decoding is 2.4-2.8x slower than bf16 on an H200: RESULTS.md,
    nf4_gemv), at the memory of that copy while the session lives."""
    self._static = self._replicas = None
    replicas = replicas_of(cache, mesh)
    if replicas:
      kw = dict(max_total_len=max_total_len, tokenizer=tokenizer, temperature=temperature, top_k=top_k,
                top_p=top_p, eos_ids=eos_ids, lora_scale=lora_scale, dtype=dtype, chunk_size=chunk_size,
                impl=impl, dense_base=dense_base, page_size=page_size, attention=attention)
      make = lambda r, p, lora_r, rng_r: SamplerSession(p, config, lora=lora_r, rng=rng_r, mesh=replica_mesh(r), **kw)
      self._replicas = ReplicaSession(
          replicas, make, lambda r: place_replica(params, lora, rng, config, r), max_total_len,
          config.vocab_size)
      self.tokenizer = tokenizer
      return
    if uses_static_cache(cache, mesh):
      from fineflax.sampling.static_session import StaticSession
      self._static = StaticSession(params, config, max_total_len=max_total_len, tokenizer=tokenizer,
                                   temperature=temperature, top_k=top_k, top_p=top_p, eos_ids=eos_ids, rng=rng,
                                   lora=lora, lora_scale=lora_scale, dtype=dtype, chunk_size=chunk_size,
                                   mesh=mesh, impl=impl, dense_base=dense_base)
      return
    self.sampling = SamplingConfig(float(temperature), int(top_k), float(top_p))
    if rng is None and not self.sampling.greedy:
      raise ValueError(f"temperature={temperature} samples: pass rng=jax.random.key(...)")
    if max_total_len < 1:
      raise ValueError(f"max_total_len={max_total_len}: must be >= 1")
    self.impl = decode_impl(impl)
    self.tp_mesh = tensor_parallel_mesh(cache, mesh)
    self.params = prepare_decode_params(params, config, self.impl, dtype, dense_base, fuse=self.tp_mesh is None)
    self.config, self.tokenizer, self.mesh = config, tokenizer, mesh
    self.rng, self.eos_ids, self.lora, self.lora_scale, self.dtype = rng, eos_ids, lora, lora_scale, dtype
    self.max_total_len, self.chunk_size = int(max_total_len), int(chunk_size)
    self.page_size, self.attention = int(page_size), attention
    self.engine = None
    self.rows: list = []

  def __getattr__(self, name):  # the static session's attributes (cache, params, ...) when it runs
    static = self.__dict__.get("_static")
    if static is None:
      raise AttributeError(name)
    return getattr(static, name)

  @property
  def cache(self) -> dict:
    """The KV cache: the engine's page pools {"k", "v"} (a list of them, one per replica, when rows split
    over a mesh's replicas; static: the static cache)."""
    if self._replicas is not None:
      return [s.cache for s in self._replicas.sessions]
    if self._static is not None:
      return self._static.cache
    self._need_started()
    return self.engine.pool

  # ----------------------------------------------------------------------------------------------
  def start(self, prompts, row_ids: Sequence[int] | None = None) -> None:
    """Prefills the cache with `prompts` (token lists; each non-empty); identical prompts share pages.
    row_ids: the rows' indices in a larger batch, for their sampling keys (default 0..B-1)."""
    if self._replicas is not None:
      return self._replicas.start(prompts)
    if self._static is not None:
      return self._static.start(prompts)
    prompts = checked_prompts(prompts, self.config.vocab_size)
    self.engine = Engine(
        self.params, self.config, max_rows=len(prompts), tokenizer=self.tokenizer, eos_ids=self.eos_ids,
        num_pages=engine_pool_pages([len(p) + self.max_total_len for p in prompts], self.page_size),
        page_size=self.page_size, chunk_size=self.chunk_size, lora=self.lora, lora_scale=self.lora_scale,
        dtype=self.dtype, impl=self.impl, attention=self.attention, prepared=True, mesh=self.tp_mesh)
    sc = self.sampling
    requests = [Request(p, max_new_tokens=0, temperature=sc.temperature, top_k=sc.top_k, top_p=sc.top_p,
                        key=None if self.rng is None else jax.random.fold_in(self.rng, i), hold=True,
                        reserve=self.max_total_len)
                for i, p in zip(range(len(prompts)) if row_ids is None else row_ids, prompts)]
    self.rows = [None] * len(prompts)
    for rows in group_identical(prompts):
      for r, seq in zip(rows, self.engine.submit_group([requests[r] for r in rows])):
        self.rows[r] = seq
    self.num_rows = len(prompts)
    self.engine.run()

  def append(self, tokens: Mapping[int, Sequence[int]] | Sequence[Sequence[int]]) -> None:
    """Feeds extra tokens (tool output) after rows' completions; mask 0. Rows given tokens become ready.

    `tokens`: one list per row, or {row: list}; rows with nothing to append are left as they are.
    """
    if self._replicas is not None:
      return self._replicas.append(tokens)
    if self._static is not None:
      return self._static.append(tokens)
    self._need_started()
    lists = checked_appends(tokens, self.num_rows, self.config.vocab_size)
    for b in lists:
      if len(lists[b]) > self.rows[b].room:
        raise ValueError(f"append(): {len(lists[b])} tokens do not fit: row {b} has {self.rows[b].room} of "
                         f"its positions left; raise max_total_len (now {self.max_total_len})")
    for b, toks in lists.items():
      if toks:
        self.engine.append(self.rows[b], toks)

  def decode(self, max_new_tokens: int, stop_strings: Sequence[str] = ()) -> None:
    """Decodes every ready row until EOS, a stop string, `max_new_tokens` new tokens or its reserve ends."""
    if self._replicas is not None:
      return self._replicas.decode(max_new_tokens, stop_strings)
    if self._static is not None:
      return self._static.decode(max_new_tokens, stop_strings)
    self._need_started()
    stop_strings = checked_decode_args(max_new_tokens, stop_strings, self.tokenizer)
    for seq in self.rows:
      if seq.status in ("ready", "prefill"):
        self.engine.resume(seq, max_new_tokens, stop_strings)
    self.engine.run()

  def result(self, width: int | None = None) -> SampleOutput:
    """The completions so far (model and appended tokens), right-padded to `width` (default: longest)."""
    if self._replicas is not None:
      return build_output(self._replicas.rows(), width, self.tokenizer)
    if self._static is not None:
      return self._static.result(width)
    self._need_started()
    return build_output(self.rows, width, self.tokenizer)

  # ----------------------------------------------------------------------------------------------
  def _need_started(self):
    if not self.rows:
      raise RuntimeError("call start(prompts) first")
