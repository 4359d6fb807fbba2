"""fineflax's paged decode-attention kernel (Pallas, Triton on GPUs; interpreted elsewhere): one query per
row read against the row's live pages of the pool in place, each live KV byte read once.

Grid (B, Hkv, splits). Program (b, h, s) holds the G = Hq / Hkv query heads of kv head h (the GQA group,
padded with zero rows to Gp = max(16, G) rows: a Triton dot needs 16) and walks its share of row b's live
pages through the block table, `pages_per_block` pages (a [pages_per_block S, Dh] K and V tile) at a time:

  length  = positions[b] + 1                      (the engine's own length, not the table's padded width)
  pages   = [first, ceil(length / S))             first = max(0, length - window) // S with a window, else 0
  split s takes pages [first + s c, first + (s + 1) c), c = ceil(live pages / splits) rounded up to a block
  scores  = softcap((q . k) * scale, cap)  in f32, key j kept when j < length and (no window or
            length - 1 - j < window); online softmax (running max m, sum l, f32 accumulator)
  splits = 1: out = acc / l written in q's dtype; splits > 1: each split writes acc / l and
  lse = m + log l (f32), merged by `merge_splits`: out = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M).

Each page id is read from the block table inside the kernel (plus the layer's base l P), so neither the
table's gather copy nor a per-layer offset array exists. Pages past the row's length, and before its window,
are never read. Numerics are `grouped_attention`'s: f32 scores, probabilities cast to V's dtype for p . v.

Under tensor parallelism (`DecodeKernel.mesh` with a "model" axis) the call is a shard_map over that axis:
each device runs the kernel on its own kv heads' pool shard and their query heads (both head axes split
into contiguous chunks, so a GQA group stays on one device); block table and positions are replicated.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

_NEG = -1e30  # finite "minus infinity" of masked scores (no inf - inf = nan in the online max)
MODEL_AXIS = "model"


@dataclasses.dataclass(frozen=True)
class DecodeKernel:
  """Block parameters of the kernel (hashable: a static argument of the engine's programs).

  pages_per_block: pages per inner step (a power of two; capped at the table's width). splits: the
  split-K factor over each row's live pages (0 = auto: enough programs for a GPU, `auto_splits`).
  num_warps / num_stages: Triton's. mesh: a mesh with a "model" axis to run per device under shard_map
  (None: one device). interpret: None = interpret unless the default backend is a GPU.
  Defaults: the fastest of 48 variants at the 8B shape, 64 rows x 1152 tokens, pages of 16, on one H200
  (benchmarks/RESULTS.md, section paged_decode: 139-141 us a layer, 0.69-0.70x the copy bandwidth; gather
  259 us, JAX's kernel 357 us); at 8 rows auto picks 8 splits (32.9 us, gather 50.8)."""
  pages_per_block: int = 4
  splits: int = 0
  num_warps: int = 4
  num_stages: int = 3
  mesh: Any = None
  interpret: bool | None = None

  def __post_init__(self):
    for name in ("pages_per_block", "num_warps"):
      v = getattr(self, name)
      if v < 1 or v & (v - 1):
        raise ValueError(f"DecodeKernel {name}={v}: must be a power of two >= 1")
    if self.splits < 0:
      raise ValueError(f"DecodeKernel splits={self.splits}: must be >= 0 (0 = auto)")
    if self.num_stages < 1:
      raise ValueError(f"DecodeKernel num_stages={self.num_stages}: must be >= 1")


def supports(head_dim: int, page_size: int) -> str | None:
  """None when the kernel applies to this head_dim / page size, else the reason (Triton tiles are powers
  of two: head_dim and page_size must be powers of two, head_dim >= 16)."""
  if head_dim < 16 or head_dim & (head_dim - 1):
    return f"head_dim={head_dim} is not a power of two >= 16"
  if page_size & (page_size - 1):
    return f"page_size={page_size} is not a power of two"
  return None


def auto_splits(rows: int, kv_heads: int, pages: int, pages_per_block: int, target: int = 512) -> int:
  """Splits so that rows x kv_heads x splits reaches `target` programs (a few per SM of a large GPU), a
  power of two, at most one split per block of the table's pages."""
  need = -(-target // max(rows * kv_heads, 1))
  splits = 1
  while splits < need and splits * 2 <= max(pages // pages_per_block, 1):
    splits *= 2
  return splits


def _kernel(len_ref, meta_ref, bt_ref, q_ref, k_ref, v_ref, *out_refs, scale, cap, page_size, ppb, splits,
            table_width):
  b, s = pl.program_id(0), pl.program_id(2)
  length = jnp.minimum(len_ref[b], table_width * page_size)
  base, window = meta_ref[0], meta_ref[1]
  first = jnp.where(window > 0, jnp.maximum(length - window, 0), 0)
  first_page = first // page_size
  end_page = (length + page_size - 1) // page_size
  chunk = ((end_page - first_page + splits - 1) // splits + ppb - 1) // ppb * ppb
  lo = first_page + s * chunk
  hi = jnp.minimum(lo + chunk, end_page)
  q = q_ref[...]
  gp, dh = q.shape
  block = ppb * page_size
  tf32 = q.dtype != jnp.float32  # f32 models keep f32 dots (no TF32 rounding)

  def body(i, carry):
    acc, m, l = carry
    p0 = lo + i * ppb
    idx = p0 + jnp.arange(ppb)
    pages = plgpu.load(bt_ref.at[b, pl.ds(p0, ppb)], mask=idx < hi, other=0) + base
    k = k_ref[pages].reshape(block, dh)
    v = v_ref[pages].reshape(block, dh)
    scores = plgpu.dot(q, k, trans_b=True, allow_tf32=tf32) * scale  # [Gp, block] f32
    if cap is not None:
      scores = jnp.tanh(scores / cap) * cap
    pos = p0 * page_size + jnp.arange(block)
    keep = (pos < length) & (pos >= first)
    scores = jnp.where(keep[None, :], scores, _NEG)
    m_new = jnp.maximum(m, scores.max(axis=1))
    corr = jnp.exp(m - m_new)
    p = jnp.exp(scores - m_new[:, None])
    l = l * corr + p.sum(axis=1)
    acc = acc * corr[:, None] + plgpu.dot(p.astype(v.dtype), v, allow_tf32=tf32)
    return acc, m_new, l

  init = (jnp.zeros((gp, dh), jnp.float32), jnp.full((gp,), _NEG, jnp.float32), jnp.zeros((gp,), jnp.float32))
  steps = jnp.maximum(hi - lo + ppb - 1, 0) // ppb
  acc, m, l = lax.fori_loop(0, steps, body, init)
  safe = jnp.where(l > 0, l, 1.0)
  out = acc / safe[:, None]
  if splits == 1:
    (o_ref,) = out_refs
    o_ref[...] = out.astype(o_ref.dtype)
  else:
    o_ref, lse_ref = out_refs
    o_ref[...] = out
    lse_ref[...] = jnp.where(l > 0, m + jnp.log(safe), _NEG)


def merge_splits(o, lse):
  """Log-sum-exp merge over axis 2 of per-split outputs o [B, Hkv, splits, Gp, Dh] (each normalised by
  its own sum) with lse [B, Hkv, splits, Gp] -> [B, Hkv, Gp, Dh] f32; splits with no keys have lse _NEG."""
  top = lse.max(axis=2, keepdims=True)
  w = jnp.exp(lse - top)
  return (o * w[..., None]).sum(axis=2) / w.sum(axis=2)[..., None]


def _decode_local(q, pool_k, pool_v, block_table, lengths, base, window, *, scale, cap, kernel: DecodeKernel):
  """The kernel on one device: q [B, Hq, Dh], pools [Hkv, N, S, Dh], block_table [B, n], lengths [B]."""
  bsz, hq, dh = q.shape
  hkv, total, page_size, _ = pool_k.shape
  n = block_table.shape[1]
  g = hq // hkv
  gp = max(16, pl.next_power_of_2(g))
  ppb = min(kernel.pages_per_block, 1 << (n.bit_length() - 1))
  splits = kernel.splits or auto_splits(bsz, hkv, n, ppb)
  qg = q.reshape(bsz, hkv, g, dh)
  if gp != g:
    qg = jnp.pad(qg, ((0, 0), (0, 0), (0, gp - g), (0, 0)))
  meta = jnp.stack([jnp.asarray(base, jnp.int32), jnp.asarray(window, jnp.int32)])
  body = functools.partial(_kernel, scale=float(scale), cap=None if cap is None else float(cap),
                           page_size=page_size, ppb=ppb, splits=splits, table_width=n)
  whole = lambda shape: pl.BlockSpec(shape, lambda *_: (0,) * len(shape))
  in_specs = [whole((bsz,)), whole((2,)), whole((bsz, n)),
              pl.BlockSpec((None, None, gp, dh), lambda i, h, s: (i, h, 0, 0)),
              pl.BlockSpec((None, total, page_size, dh), lambda i, h, s: (h, 0, 0, 0)),
              pl.BlockSpec((None, total, page_size, dh), lambda i, h, s: (h, 0, 0, 0))]
  if splits == 1:
    out_specs = [pl.BlockSpec((None, None, gp, dh), lambda i, h, s: (i, h, 0, 0))]
    out_shape = [jax.ShapeDtypeStruct((bsz, hkv, gp, dh), q.dtype)]
  else:
    out_specs = [pl.BlockSpec((None, None, None, gp, dh), lambda i, h, s: (i, h, s, 0, 0)),
                 pl.BlockSpec((None, None, None, gp), lambda i, h, s: (i, h, s, 0))]
    out_shape = [jax.ShapeDtypeStruct((bsz, hkv, splits, gp, dh), jnp.float32),
                 jax.ShapeDtypeStruct((bsz, hkv, splits, gp), jnp.float32)]
  interpret = kernel.interpret if kernel.interpret is not None else jax.default_backend() != "gpu"
  outs = pl.pallas_call(
      body, grid=(bsz, hkv, splits), in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
      interpret=interpret, name=f"fineflax_paged_decode_ppb{ppb}_s{splits}",
      compiler_params=plgpu.CompilerParams(num_warps=kernel.num_warps, num_stages=kernel.num_stages),
  )(lengths.astype(jnp.int32), meta, block_table.astype(jnp.int32), qg, pool_k, pool_v)
  out = outs[0] if splits == 1 else merge_splits(*outs)
  return out[:, :, :g].reshape(bsz, hq, dh).astype(q.dtype)


def paged_decode_attention(q, pool_k, pool_v, block_table, positions, base, window, scale: float, cap,
                           kernel: DecodeKernel = DecodeKernel()):
  """Attention of one query a row, q [B, 1, Hq, Dh] at positions [B, 1], over the row's pages of a layer
  (page ids block_table + base in the pools [Hkv, L P, S, Dh]) -> [B, 1, Hq, Dh]. window: 0 / None = full,
  else the layer's sliding window (may be traced). cap: the logit soft-cap or None."""
  if q.shape[1] != 1:
    raise ValueError(f"paged_decode_attention: q has T={q.shape[1]} tokens a row; the kernel decodes T=1")
  reason = supports(pool_k.shape[3], pool_k.shape[2])
  if reason:
    raise ValueError(f"paged_decode_attention: {reason}; use the gather path")
  hq, hkv = q.shape[2], pool_k.shape[0]
  mesh = kernel.mesh
  n = 1 if mesh is None or MODEL_AXIS not in mesh.shape else int(mesh.shape[MODEL_AXIS])
  if hq % hkv or hkv % n:
    raise ValueError(f"paged_decode_attention: Hq={hq}, Hkv={hkv} over {n} devices: Hq must be a multiple of "
                     f"Hkv and Hkv of the devices")
  lengths = positions[:, 0] + 1
  window = 0 if window is None else window
  run = functools.partial(_decode_local, scale=scale, cap=cap, kernel=kernel)
  if n == 1:
    return run(q[:, 0], pool_k, pool_v, block_table, lengths, base, window)[:, None]
  from jax.sharding import PartitionSpec as P
  heads, pools, rep = P(None, MODEL_AXIS, None), P(MODEL_AXIS), P()
  sharded = jax.shard_map(run, mesh=mesh, in_specs=(heads, pools, pools, rep, rep, rep, rep),
                          out_specs=heads, check_vma=False)
  return sharded(q[:, 0], pool_k, pool_v, block_table, lengths, jnp.asarray(base, jnp.int32),
                 jnp.asarray(window, jnp.int32))[:, None]
