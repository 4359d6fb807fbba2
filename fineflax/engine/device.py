"""The engine's jitted device functions over a paged KV cache (`fineflax.models.paged`).

Every function donates the pool (updated in place) and is compiled once per (static settings, shapes);
the host rounds shapes up to buckets: rows (`row_bucket`), pages read per row (`page_bucket`), block
lengths (`engine.decode.bucket`), so a few programs serve any mix of lengths. `pool_sharding` (static;
None on one device): the returned pool keeps the input pool's split over the mesh (tensor parallelism,
`engine.tensor_parallel`), so the donated buffers are reused and the next call sees the same layout.

State of a decoding row ("pending token" scheme, as `fineflax.engine.decode`): the row's sequence is in
the cache up to position pos - 1; `pending` is its last token, at position pos, not yet in the cache. A
decode step feeds `pending` at `pos`, samples the next token from its logits and makes it the new pending.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fineflax.models.decoder import logits_from_hidden
from fineflax.models.paged import init_paged_cache
from fineflax.engine.decode import cast_params, decode_loop, hidden_states
from fineflax.engine.processors import RowFilters, sample_rows
from fineflax.engine.tensor_parallel import constrain


def row_bucket(n: int, minimum: int = 1, base: int = 2) -> int:
  """Rows of a device call: max(n, minimum) rounded up to a power of two; base 4: the smallest
  m * 4^k >= n, m = `minimum` rounded up to a power of two (half the buckets, up to 4x the rows)."""
  if base == 2:
    return 1 << max(max(int(n), int(minimum)) - 1, 0).bit_length()
  b = row_bucket(minimum)
  while b < n:
    b *= base
  return b


def geometric_bucket(n: int, steps: int) -> int:
  """n rounded up to the next integer of the form 2^k * (1 + j / steps), j = 0 .. steps - 1: at most
  (1 + 1 / steps) x n, `steps` sizes per doubling."""
  n = max(int(n), 1)
  p = 1 << (n - 1).bit_length()  # smallest power of two >= n
  half = p // 2
  for j in range(1, steps):
    if half * j % steps == 0 and half + half * j // steps >= n:
      return half + half * j // steps
  return p


def page_bucket(n: int, limit: int | None = None, steps: int = 2) -> int:
  """Pages read per row: n rounded up to the next 2^k or 3 * 2^(k-1) (`geometric_bucket` with 2 steps:
  at most 1.5x the pages needed, two programs per doubling; steps=1: powers of two), capped at `limit`."""
  out = geometric_bucket(n, steps)
  return out if limit is None else min(out, max(int(limit), max(int(n), 1)))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def new_pool(config, num_pages: int, page_size: int, dtype) -> dict:
  """Zero pools (one device call; see `fineflax.models.paged.init_paged_cache`)."""
  return init_paged_cache(config, num_pages, page_size, dtype)


@functools.partial(jax.jit, static_argnames=("num_layers", "pool_sharding"), donate_argnames=("pool",))
def copy_pages(pool, src, dst, *, num_layers: int, pool_sharding=None):
  """The pool with page src[i] copied to page dst[i] in every layer (copy on write); src, dst int32 [C]
  (pairs (0, 0) copy the trash page onto itself: padding)."""
  per_layer = pool["k"].shape[1] // num_layers
  offsets = (jnp.arange(num_layers) * per_layer)[:, None]
  s, d = (src[None] + offsets).reshape(-1), (dst[None] + offsets).reshape(-1)
  return constrain({name: x.at[:, d].set(x[:, s]) for name, x in pool.items()}, pool_sharding)


@functools.partial(jax.jit, static_argnames=("config", "dtype", "impl", "pool_sharding"), donate_argnames=("pool",))
def prefill(params, pool, block_table, tokens, positions, valid, lora, lora_scale, *, config, dtype, impl,
            pool_sharding=None):
  """Writes tokens [B, T] (valid [B, T]: real tokens, a prefix of each row) at `positions` [B, T] of the
  rows' pages (block_table [B, n]); returns the pool. No logits are computed."""
  params = cast_params(params, dtype)
  cache = {"k": pool["k"], "v": pool["v"], "block_table": block_table}
  _, cache = hidden_states(impl, params, config, tokens, cache, positions=positions, attention_mask=valid,
                     lora=lora, lora_scale=lora_scale, dtype=dtype)
  return constrain({"k": cache["k"], "v": cache["v"]}, pool_sharding)


@functools.partial(jax.jit, static_argnames=("config", "dtype", "impl", "kernel", "filters", "num_steps",
                                             "pool_sharding"), donate_argnames=("pool",))
def decode_chunk(params, pool, block_table, state, lora, lora_scale, *, config, dtype, impl: str,
                 kernel: str, filters: RowFilters, num_steps: int, pool_sharding=None):
  """Up to `num_steps` decode steps under `lax.while_loop`, stopping early once no row is active.

  block_table [B, n]: each row's pages, covering every position it may write in this chunk.
  state (per row [B]): pending, pos, budget (tokens still allowed), count (tokens this sequence sampled
  before: token t of a sequence is drawn with fold_in(key, t), so a sequence's samples do not depend on
  the rows beside it), active bool, temperature, top_k, top_p, key uint32 [B, 2] (threefry key data),
  eos int32 [B, E] (-1 = unused). Steps, stops and outputs as `engine.decode.decode_loop`: returns
  (pool, state, hit_eos [B], out).
  """
  params = cast_params(params, dtype)
  keys = jax.random.wrap_key_data(state["key"])

  def step_fn(pool, st, step):
    cache = {"k": pool["k"], "v": pool["v"], "block_table": block_table}
    h, cache = hidden_states(impl, params, config, st["pending"][:, None], cache, positions=st["pos"][:, None],
                       attention_mask=st["active"][:, None], lora=lora, lora_scale=lora_scale, dtype=dtype,
                       paged_kernel=kernel)
    logits = logits_from_hidden(params, config, h)[:, 0]
    with jax.named_scope("sampling"):  # profiles find sampling by this scope
      step_keys = jax.vmap(jax.random.fold_in)(keys, st["count"])
      tok, lp, raw = sample_rows(logits, step_keys, st["temperature"], st["top_k"], st["top_p"], filters)
    return constrain({"k": cache["k"], "v": cache["v"]}, pool_sharding), tok, lp, raw

  pool, state, hit_eos, out = decode_loop(step_fn, pool, state, state["eos"], num_steps)
  return constrain(pool, pool_sharding), state, hit_eos, out
