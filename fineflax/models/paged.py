"""The paged KV cache: a cache layout of the decoder (vLLM's PagedAttention) where each row's keys and values
live in fixed-size pages of one pool, so memory and attention reads follow the live tokens.

Layout (`init_paged_cache`; a paged cache dict is {"k", "v", "block_table"}):

  k, v          [Hkv, L * P, S, Dh]  one pool per tensor for all L layers: layer l owns pages [l P, (l + 1) P)
  block_table   [B, n] int32         page ids in 0 .. P - 1 of each row's first n pages, in order

A row's token at position p (positions count from 0 along the row's own sequence, so a position is also the
token's index in the cache) lives at page block_table[b, p // S] of its layer, offset p % S. Page 0 of every
layer is the trash page: never handed out, it takes the writes of padding tokens, and unused table entries
point at it. Rows may share pages (a prompt's pages shared by the samples of a group): the host allocator
(`fineflax.engine.pages`) guarantees that a page is written by one row only.

Why heads first and layers folded into the page axis: layer l's pool is read in place through page ids
offset by l P (inside the layer scan no per-layer slice of the pool is copied), and [Hkv, pages, S, Dh] is
the layout of JAX's Pallas paged-attention kernel.

Attention over the pages (`paged_attention`), for queries q [B, T, Hq, Dh] at `positions` [B, T]:
  "gather"  the n pages of every row gathered into [B, Hkv, n S, Dh], then `grouped_attention` with key j
            visible to a query at position p when j <= p and (window == 0 or p - j < window); the cost
            follows n, which the caller sizes to its longest row (a few compiled buckets). Any T, windows.
  "pallas"  `jax.experimental.pallas.ops.gpu.paged_attention` (Triton on GPUs; interpreted elsewhere): each
            row reads only its pages up to its length p + 1. T = 1, no sliding windows (else "gather").
  "paged_decode" (or a `paged_decode.DecodeKernel` with its block parameters and mesh): fineflax's own
            kernel (`fineflax.models.paged_decode`): one program per (row, kv head, split) with the GQA
            group, live pages read in place, windows and soft-cap. T = 1 (else "gather").
Scores are softcap(q.k * scale, cap) in f32 either way (the decoder's own attention numerics).

Writes are one scatter per layer into the donated pool, updated in place (no second buffer:
tests/test_models_paged.py). XLA:CPU rewrites the whole pool at each scatter (measured: CPU decoding costs
time in proportion to the pool; keep CPU pools small); XLA:GPU's scatter emitter writes only the updates
into an aliased buffer: benchmarks/engine.py case a times the step with pools of 4096 vs 1024 tokens a row.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fineflax.models.attention import grouped_attention
from fineflax.models.paged_decode import DecodeKernel, paged_decode_attention

PAGED_KERNELS = ("gather", "pallas", "paged_decode")
TRASH_PAGE = 0


def init_paged_cache(config, num_pages: int, page_size: int, dtype=jnp.bfloat16) -> dict:
  """Zero pools {"k", "v"} [Hkv, L * num_pages, page_size, Dh] (page 0 of each layer is the trash page)."""
  if num_pages < 2:
    raise ValueError(f"num_pages={num_pages}: need at least 2 (page 0 is the trash page)")
  shape = (config.num_kv_heads, config.num_layers * num_pages, page_size, config.head_dim)
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def is_paged(cache) -> bool:
  """True for a paged cache dict (it has a block table), False for the static one of `decoder.init_cache`."""
  return cache is not None and "block_table" in cache


def pages_per_layer(pool: jnp.ndarray, num_layers: int) -> int:
  return pool.shape[1] // num_layers


def write_pages(pool: jnp.ndarray, layer, new: jnp.ndarray, block_table: jnp.ndarray, positions: jnp.ndarray,
                valid: jnp.ndarray, num_layers: int) -> jnp.ndarray:
  """The pool with new [B, T, Hkv, Dh] written at each token's (page, offset) of layer `layer` (an int or
  a traced index); tokens with valid False are written to the trash page."""
  with jax.named_scope("kv_write"):  # profiles find the scatter by this scope (benchmarks/profile_engine.py)
    s, n = pool.shape[2], block_table.shape[1]
    index = jnp.minimum(positions // s, n - 1)
    page = jnp.where(valid, jnp.take_along_axis(block_table, index, axis=1), TRASH_PAGE)
    page = page + layer * pages_per_layer(pool, num_layers)
    return pool.at[:, page, positions % s].set(new.transpose(2, 0, 1, 3).astype(pool.dtype))


def paged_attention(q, pool_k, pool_v, layer, block_table, positions, window, scale: float, cap, *,
                    num_layers: int, kernel: str = "gather"):
  """Attention of q [B, T, Hq, Dh] over each row's pages (see the module docstring) -> [B, T, Hq, Dh].

  window: the layer's sliding window (0 = full; a traced value inside the layer scan) or None when the
  model has no sliding layers. kernel: a name of PAGED_KERNELS or a `DecodeKernel`.
  """
  if not isinstance(kernel, DecodeKernel) and kernel not in PAGED_KERNELS:
    raise ValueError(f"paged attention kernel {kernel!r}; choose one of {PAGED_KERNELS}")
  with jax.named_scope("paged_attention"):  # profiles find attention by this scope
    return _paged_attention(q, pool_k, pool_v, layer, block_table, positions, window, scale, cap,
                            num_layers=num_layers, kernel=kernel)


def _paged_attention(q, pool_k, pool_v, layer, block_table, positions, window, scale, cap, *, num_layers, kernel):
  base = layer * pages_per_layer(pool_k, num_layers)
  if kernel == "paged_decode":
    kernel = DecodeKernel()
  if isinstance(kernel, DecodeKernel) and q.shape[1] == 1:
    return paged_decode_attention(q, pool_k, pool_v, block_table, positions, base, window, scale, cap, kernel)
  if kernel == "pallas" and q.shape[1] == 1 and window is None:
    return _pallas_attention(q, pool_k, pool_v, block_table + base, positions, scale, cap)
  hkv, _, s, d = pool_k.shape
  b, n = block_table.shape
  def gather(pool):  # [B, Hkv, n S, Dh]: the static unrolled cache's layout (a transpose XLA may fuse in)
    return pool[:, block_table + base].transpose(1, 0, 2, 3, 4).reshape(b, hkv, n * s, d).astype(q.dtype)

  key_pos = jnp.arange(n * s)
  mask = key_pos[None, None, :] <= positions[:, :, None]
  if window is not None:
    mask = mask & ((window == 0) | (positions[:, :, None] - key_pos[None, None, :] < window))
  return grouped_attention(q, gather(pool_k), gather(pool_v), mask, scale, cap, kv_layout="bksd")


def _largest_pow2_divisor(n: int, cap: int) -> int:
  p = 1
  while p * 2 <= cap and n % (p * 2) == 0:
    p *= 2
  return p


def _pallas_attention(q, pool_k, pool_v, pages, positions, scale, cap):
  """One query per row through the Pallas kernel: q is pre-scaled (the kernel applies no scale); its
  `lengths` are positions + 1; splits and compute blocks are the powers of two dividing n (Triton's
  blocks must be powers of two)."""
  from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention as pallas_paged
  n = pages.shape[1]
  k_splits = _largest_pow2_divisor(n, 16)
  per_block = _largest_pow2_divisor(n // k_splits, 8)
  qs = (q[:, 0].astype(jnp.float32) * scale).astype(pool_k.dtype)
  out = pallas_paged(qs, pool_k, pool_v, pages, (positions[:, 0] + 1).astype(jnp.int32),
                     block_h=16, pages_per_compute_block=per_block, k_splits=k_splits,
                     attn_logits_soft_cap=cap, interpret=jax.default_backend() != "gpu")
  return out[:, None].astype(q.dtype)


def pallas_available() -> bool:
  """Whether the installed jax ships the Pallas GPU paged-attention kernel."""
  try:
    from jax.experimental.pallas.ops.gpu import paged_attention  # noqa: F401
  except ImportError:
    return False
  return True
