"""The static-cache session (`SamplerSession(cache="static")`, and sessions on a mesh of several devices):
the API and results of `SamplerSession` (see `fineflax.sampling.session`) over one KV cache [B, S] whose
slot index is shared by every row (left-padded prompts; every row's cache sized for the longest; rows
and cache split over the mesh's devices). Stop strings mask the cache slots written after the kept
tokens, so a later `append` continues exactly from the kept text. Without stop strings a `decode` call
is one device loop.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fineflax.engine.decode import (bucket, decode_chunk, decode_impl, feed_block, prepare_decode_params,
                                    resolve_eos_ids)
from fineflax.engine.processors import SamplingConfig
from fineflax.engine.prompts import checked_appends, checked_decode_args, checked_prompts
from fineflax.engine.stops import stop_cut
from fineflax.mesh import batch_sharding, put
from fineflax.models.decoder import init_cache
from fineflax.models.unrolled import init_unrolled_cache
from fineflax.sampling.output import SampleOutput, build_output


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _empty_cache(impl: str, config, batch: int, cache_len: int, dtype) -> dict:
  """A zero KV cache in one device call (not one eager `zeros` per layer: 60 dispatches for 30 layers)."""
  if impl == "unrolled":
    return init_unrolled_cache(config, batch, cache_len, dtype)
  return init_cache(config, batch, cache_len, dtype)


@dataclasses.dataclass
class _Row:
  prompt_len: int
  status: str = "ready"
  tokens: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  raw_logprobs: list = dataclasses.field(default_factory=list)
  model: list = dataclasses.field(default_factory=list)
  slot: list = dataclasses.field(default_factory=list)  # cache slot of the step that produced a token
  seg_start: int = 0
  excess_chars: int = 0


class StaticSession:
  """Host-side driver of `feed_block` / `decode_chunk` for one batch of rows (see module docstring)."""

  def __init__(self, params, config, *, max_total_len: int, tokenizer=None, temperature: float = 1.0,
               top_k: int = 0, top_p: float = 1.0, eos_ids: Sequence[int] | None = None, rng=None,
               lora=None, lora_scale: float = 1.0, dtype=jnp.bfloat16, chunk_size: int = 32, mesh=None,
               impl: str | None = "auto", dense_base: bool = False):
    """impl: the decoder (see `decode_impl`; "auto": "unrolled" on GPUs, else "scan"). "unrolled"
    re-lays the weights out once here (`prepare_unrolled`): an extra copy of the dense weights while the
    session lives. dense_base=True decodes a quantised base from a `dtype` copy of its dequantised
    weights made here (same weights; NF4 decoding is 2.4-2.8x slower than bf16 on an H200: RESULTS.md,
    nf4_gemv), at the memory of that copy while the session lives."""
    self.impl = decode_impl(impl)
    params = prepare_decode_params(params, config, self.impl, dtype, dense_base)
    self.params, self.config, self.tokenizer = params, config, tokenizer
    self.mesh = mesh
    self.sampling = SamplingConfig(float(temperature), int(top_k), float(top_p))
    if rng is None:
      if not self.sampling.greedy:
        raise ValueError(f"temperature={temperature} samples: pass rng=jax.random.key(...)")
      rng = jax.random.key(0)
    self.eos_ids = resolve_eos_ids(eos_ids, config, tokenizer)
    width = -(-max(len(self.eos_ids), 1) // 4) * 4
    self._eos_arr = jnp.asarray(list(self.eos_ids) + [-1] * (width - len(self.eos_ids)), jnp.int32)
    if max_total_len < 1:
      raise ValueError(f"max_total_len={max_total_len}: must be >= 1")
    self.max_total_len, self.chunk_size = int(max_total_len), int(chunk_size)
    self.rng, self.lora, self.dtype = rng, lora, dtype
    self.lora_scale = jnp.asarray(lora_scale, jnp.float32)
    self.rows: list[_Row] = []

  # ----------------------------------------------------------------------------------------------
  def start(self, prompts) -> None:
    """Prefills the cache with `prompts` (token lists; each non-empty)."""
    prompts = checked_prompts(prompts, self.config.vocab_size)
    self.num_rows = len(prompts)
    self.batch = bucket(len(prompts), minimum=1)
    if self.mesh is not None:  # rows split evenly over every device of the mesh (all processes')
      n = self.mesh.devices.size
      self.batch = -(-self.batch // n) * n
    block = bucket(max(len(p) for p in prompts) - 1)
    self.cache_len = block + bucket(self.max_total_len, minimum=16, multiple=64)
    self.cache = self._new_cache()
    self.index = 0
    self.rows = [_Row(prompt_len=len(p)) for p in prompts]
    self.rows += [_Row(prompt_len=1, status="pad") for _ in range(self.batch - len(prompts))]
    self.pending = np.zeros(self.batch, np.int32)
    self.pos = np.zeros(self.batch, np.int32)
    self._feed([p[:-1] for p in prompts], block)
    for i, p in enumerate(prompts):
      self.pending[i], self.pos[i] = p[-1], len(p) - 1

  def append(self, tokens: Mapping[int, Sequence[int]] | Sequence[Sequence[int]]) -> None:
    """Feeds extra tokens (tool output) after rows' completions; mask 0. Rows given tokens become ready.

    `tokens`: one list per row, or {row: list}; rows with nothing to append are left as they are.
    """
    self._need_started()
    lists = [[] for _ in range(self.batch)]
    for b, toks in checked_appends(tokens, self.num_rows, self.config.vocab_size).items():
      lists[b] = toks
    longest = max(len(x) for x in lists)
    if longest == 0:
      return
    width = bucket(longest, minimum=8)
    if self.index + width > self.cache_len:
      width = longest
    if self.index + width > self.cache_len:
      raise ValueError(f"append(): {longest} tokens do not fit: {self.cache_len - self.index} cache "
                       f"slots left; raise max_total_len (now {self.max_total_len})")
    self._feed([[int(self.pending[b])] + x[:-1] if x else [] for b, x in enumerate(lists)], width,
               start_pos=self.pos)
    for b, x in enumerate(lists):
      if not x:
        continue
      row = self.rows[b]
      row.tokens += x
      row.logprobs += [0.0] * len(x)
      row.raw_logprobs += [0.0] * len(x)
      row.model += [False] * len(x)
      row.slot += [-1] * len(x)
      row.seg_start, row.status, row.excess_chars = len(row.tokens), "ready", 0
      self.pending[b], self.pos[b] = x[-1], self.pos[b] + len(x)

  def decode(self, max_new_tokens: int, stop_strings: Sequence[str] = ()) -> None:
    """Decodes every ready row until EOS, a stop string, `max_new_tokens` new tokens or a full cache."""
    self._need_started()
    stop_strings = checked_decode_args(max_new_tokens, stop_strings, self.tokenizer)
    room = self.cache_len - self.index
    ready = np.array([r.status == "ready" for r in self.rows])
    budget = np.where(ready, min(int(max_new_tokens), room), 0).astype(np.int32)
    for b in np.flatnonzero(ready & (budget == 0)):
      self.rows[b].status = "length"
    active = budget > 0
    num_steps = self.chunk_size if stop_strings else bucket(max_new_tokens)
    while active.any():
      self.rng, key = jax.random.split(self.rng)
      state = {"pending": self._put(self.pending), "pos": self._put(self.pos),
               "active": self._put(active), "budget": self._put(budget)}
      self.cache, state, eos, out = decode_chunk(
          self.params, self.cache, state, key, self._eos_arr, self.lora, self.lora_scale,
          config=self.config, dtype=self.dtype, sampling=self.sampling, num_steps=num_steps, impl=self.impl)
      state, eos, out = _fetch((state, eos, out))
      chunk_start, self.index = self.index, self.index + int(out["steps"])
      self.pending, self.pos = np.array(state["pending"]), np.array(state["pos"])
      active, budget = np.array(state["active"]), np.array(state["budget"])
      keep = None
      for b in np.flatnonzero(out["emitted"].any(axis=1)):
        row, n = self.rows[b], int(out["emitted"][b].sum())
        row.tokens += out["tokens"][b, :n].tolist()
        row.logprobs += out["logprobs"][b, :n].tolist()
        row.raw_logprobs += out["raw_logprobs"][b, :n].tolist()
        row.model += [True] * n
        row.slot += list(range(chunk_start, chunk_start + n))
        if not active[b]:
          row.status = "eos" if eos[b] else "length"
        if stop_strings and self._truncate_at_stop(b, stop_strings):
          active[b] = False
          keep = np.ones((self.batch, self.cache_len), bool) if keep is None else keep
          keep[b, row.slot[-1] + 1:] = False
      if keep is not None:
        self.cache["mask"] = self.cache["mask"] & self._put(keep)

  def result(self, width: int | None = None) -> SampleOutput:
    """The completions so far (model and appended tokens), right-padded to `width` (default: longest)."""
    self._need_started()
    return build_output(self.rows[:self.num_rows], width, self.tokenizer)

  # ----------------------------------------------------------------------------------------------
  def _feed(self, lists, width, start_pos=None):
    """Writes each row's list right-aligned in a [batch, width] block (positions from start_pos)."""
    tokens = np.zeros((self.batch, width), np.int32)
    mask = np.zeros((self.batch, width), bool)
    positions = np.zeros((self.batch, width), np.int32)
    for b, x in enumerate(lists):
      if x:
        tokens[b, width - len(x):] = x
        mask[b, width - len(x):] = True
        first = 0 if start_pos is None else int(start_pos[b])
        positions[b, width - len(x):] = np.arange(first, first + len(x))
    self.cache = feed_block(self.params, self.cache, self._put(tokens), self._put(mask),
                            self._put(positions), self.lora, self.lora_scale, config=self.config,
                            dtype=self.dtype, impl=self.impl)
    self.index += width

  def _new_cache(self) -> dict:
    """An empty KV cache (unrolled: per-layer k / v [B, Hkv, S, Dh]; scan: k / v [L, B, S, Hkv, Dh]); with
    a mesh, created directly split over its devices by rows, so no device (or process) holds all of it."""
    make = functools.partial(_empty_cache, self.impl, self.config, self.batch, self.cache_len, self.dtype)
    if self.mesh is None or self.mesh.devices.size == 1:
      return make()
    row_axis = {} if self.impl == "unrolled" else {"k": 1, "v": 1}
    shardings = {k: jax.tree.map(lambda x, k=k: batch_sharding(self.mesh, row_axis.get(k, 0), len(x.shape))
                                 if x.shape else NamedSharding(self.mesh, P()), v)
                 for k, v in jax.eval_shape(make).items()}
    return jax.jit(make, out_shardings=shardings)()

  def _put(self, x, batch_axis: int = 0):
    """x as a device array; with a mesh, split along `batch_axis` over every device, so the KV cache
    and every per-row input are sharded alike. Across processes every process runs this session on the
    same global rows (same host control flow) and computes only its devices' rows."""
    if self.mesh is None or self.mesh.devices.size == 1 or np.ndim(x) <= batch_axis:
      return jnp.asarray(x)
    return put(x, batch_sharding(self.mesh, batch_axis, np.ndim(x)))

  def _truncate_at_stop(self, b: int, stop_strings) -> bool:
    """Cuts row b after the shortest segment prefix whose text holds a stop string; True if cut."""
    row = self.rows[b]
    cut = stop_cut(row.tokens[row.seg_start:], stop_strings,
                   lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True))
    if cut is None:
      return False
    end = row.seg_start + cut[0]
    for attr in ("tokens", "logprobs", "raw_logprobs", "model", "slot"):
      setattr(row, attr, getattr(row, attr)[:end])
    row.status, row.excess_chars = "stop", cut[1]
    self.pending[b], self.pos[b] = row.tokens[-1], row.prompt_len + len(row.tokens) - 1
    return True

  def _need_started(self):
    if not self.rows:
      raise RuntimeError("call start(prompts) first")


def _fetch(tree):
  """jax.device_get of a pytree; arrays split over several processes are all-gathered first, so every
  process sees every row."""
  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      from jax.experimental import multihost_utils
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jax.device_get(x)
  return jax.tree.map(get, tree)
