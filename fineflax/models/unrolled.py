"""The decoder for KV-cache decoding with its layers unrolled over per-layer weights read in place.

The training path (`decoder.forward_hidden`) scans over weights stacked on a leading axis L; inside a scan
XLA copies each layer's weight slices out of the stacked arrays every step (a memcpy of all the weights
per decoded token). Here the weights are re-laid out once, at sampler setup, by `prepare_unrolled`:

  embed [V, H], final_norm [H], lm_head/kernel [H, V] (absent when tied)   cast to the compute dtype
  layers: a list of L dicts, one per layer:
    attn_norm, mlp_norm, q_norm, k_norm, post_attn_norm, post_mlp_norm   (the layer's vectors)
    qkv     {"kernel_t": [Nq + 2 Nkv, H], "bias": [Nq + 2 Nkv]?}   q | k | v outputs concatenated
    o       {"kernel_t": [H, Nq]}
    gate_up {"kernel_t": [2 I, H]}                                  gate | up outputs concatenated
    down    {"kernel_t": [H, I]}

`kernel_t` is a dense kernel transposed to [out, in] (y = x @ kernel_t.T, the layout of torch's Linear):
at M = 1 row a dot XLA strength-reduces to multiply + reduce then reduces over the contiguous minor
axis. With `transpose=False` the key is `kernel` [in, out] instead. A group with a quantised kernel
(NF4 / int8, anything with `.dequantize`) is not copied: its linears stay stacked under "quantized" {name:
{"kernel": [L, ...] quantised, "bias"?}} and layer i is dequantised inside the step; in the K-major NF4 layout
(`kmajor`) the copy made anyway is fused per group: "quantized" {"qkv" | "gate_up": {"kernel": NF4KMajor
[L, ...], "bias"?}} (one product a group, as the dense groups).

The static KV cache of this path (`init_unrolled_cache`) is per layer, in the layout the attention dots
read without a transpose: k, v = tuples of L arrays [B, Hkv, S, Dh]; mask, pos [B, S]; index as
`decoder.init_cache`. A paged cache (`fineflax.models.paged`) is the decoder's, read the same way. The
arithmetic is that of `decoder.forward_hidden` with a cache, operation for operation (same norms, rope,
masks, bias and LoRA order), so outputs match it up to the dot kernels' summation order.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fineflax.models.config import ModelConfig
from fineflax.models.attention import grouped_attention
from fineflax.models.decoder import ACTIVATIONS, cache_masks, lora_down, lora_up, materialize, matmul, rms_norm
from fineflax.models.paged import is_paged, paged_attention, write_pages
from fineflax.models.rope import apply_rope, layer_rope
from fineflax.quant.matmul import decode_layout
from fineflax.quant.nf4 import NF4Tensor
from fineflax.quant.nf4_kmajor import NF4KMajor, concat_reason, from_nf4, from_nf4_concat, kmajor_reason
from fineflax.quant.nf4_layer import NF4Layer
from fineflax.quant.sharded import ShardedNF4

GROUPS = (("qkv", ("q", "k", "v")), ("o", ("o",)), ("gate_up", ("gate", "up")), ("down", ("down",)))


def _is_quantized(w) -> bool:
  return hasattr(w, "dequantize")


def _cast(x, dtype):
  return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x


def _layer(p: dict, i: int) -> dict:
  """Layer i of a stacked quantised linear {"kernel", "bias"?}: an NF4 kernel as an `NF4Layer` view (a
  tensor-parallel `ShardedNF4` at layer i), read in place by the fused kernel and sliced inside XLA's
  dequantisation otherwise; other leaves sliced."""
  def one(v):
    if isinstance(v, (NF4Tensor, NF4KMajor)) and len(v.lead_shape) == 1:
      return NF4Layer(v, i)
    if isinstance(v, ShardedNF4) and v.layer is None and len(v.w.lead_shape) == 1:
      return v.at_layer(i)  # each device's shard read in place at layer i
    return jax.tree.map(lambda a: a[i], v)
  return {k: one(v) for k, v in p.items()}


def _kmajor(v):
  """A stacked NF4 kernel as its K-major copy (`NF4KMajor`) where that layout applies; else v."""
  if isinstance(v, NF4Tensor) and len(v.lead_shape) == 1 and kmajor_reason(v) is None:
    return from_nf4(v)
  return v


def _fuse_kmajor(quantized: dict, dtype) -> dict:
  """{group: {"kernel": NF4KMajor [K, sum N_i], "bias"?}} for each group of GROUPS with several linears, all
  quantised NF4 kernels that `from_nf4_concat` takes (same K and dtype): one product a group, as the dense
  groups; a member without a bias adds zeros."""
  out = {}
  for group, names in GROUPS:
    if len(names) < 2 or not all(n in quantized for n in names):
      continue
    kernels = tuple(quantized[n]["kernel"] for n in names)
    if concat_reason(kernels) is not None:
      continue
    out[group] = {"kernel": from_nf4_concat(kernels)}
    if any("bias" in quantized[n] for n in names):
      out[group]["bias"] = jnp.concatenate(
          [_cast(quantized[n]["bias"], dtype) if "bias" in quantized[n]
           else jnp.zeros((*k.lead_shape, k.shape[1]), dtype) for n, k in zip(names, kernels)], axis=-1)
  return out


def prepare_unrolled(params, config: ModelConfig, dtype=jnp.bfloat16, transpose: bool = True,
                     dequantize: bool = False, fuse: bool = True, kmajor: bool | None = None) -> dict:
  """The decode weights (see the module docstring) from a stacked `decoder` parameter pytree.

  Dense kernels are cast to `dtype`, concatenated per group along the output axis and (transpose=True)
  transposed, in one jitted call: a fresh copy of the dense linear weights (the caller's params are not
  modified). Quantised kernels are not copied: they stay stacked under "quantized" {name: {"kernel",
  "bias"?}} and `forward_unrolled` indexes layer i inside its jitted step, where the slice fuses into
  the dequantisation. dequantize=True instead dequantises them (to `dtype`) into the dense groups like
  the rest: a dense copy of the whole base, decoded at a dense kernel's speed. embed / final_norm /
  lm_head are cast (no copy when already `dtype`). fuse=False keeps each dense linear apart, per layer
  {name: {"kernel": [in, out], "bias"?}} (tensor parallelism splits q, k, v over their own heads:
  `fineflax.engine.tensor_parallel`). kmajor (default: `quant.matmul.decode_layout()` is "kmajor", and
  fuse) keeps each stacked NF4 kernel as its K-major copy (`NF4KMajor`: +4.5 bits a weight while the
  weights live) for the faster decode kernel, q|k|v and gate|up concatenated where fuse (`_fuse_kmajor`).
  """
  kmajor = (fuse and decode_layout() == "kmajor") if kmajor is None else kmajor
  layers = params["layers"]
  quantized = {} if dequantize else {
      n: layers[n] for _, names in GROUPS for n in names
      if n in layers and any(_is_quantized(layers[m]["kernel"]) for m in names if m in layers)}
  dense = {n: p for n, p in layers.items() if n not in quantized}
  out = {"embed": _cast(params["embed"], dtype), "final_norm": _cast(params["final_norm"], dtype),
         "layers": _prepare_layers(dense, config, dtype, transpose, fuse)}
  if quantized:
    fused = _fuse_kmajor(quantized, dtype) if kmajor and fuse else {}
    done = {n for group in fused for n in dict(GROUPS)[group]}
    keep = _kmajor if kmajor else (lambda v: v)
    out["quantized"] = {**fused, **{n: {k: keep(v) if _is_quantized(v) else _cast(v, dtype) for k, v in p.items()}
                                    for n, p in quantized.items() if n not in done}}
  if "lm_head" in params:
    k = params["lm_head"]["kernel"]
    out["lm_head"] = {"kernel": k if _is_quantized(k) and not dequantize else materialize(k, dtype)}
  return out


@functools.partial(jax.jit, static_argnames=("config", "dtype", "transpose", "fuse"))
def _prepare_layers(layers, config: ModelConfig, dtype, transpose: bool, fuse: bool = True) -> list:
  """Per-layer dicts of the vectors and the fused dense groups (groups absent from `layers` skipped);
  fuse=False: each linear apart, {name: {"kernel": [in, out], "bias"?}}."""
  out = []
  for i in range(config.num_layers):
    lp = {n: _cast(layers[n][i], dtype) for n in config.vector_names()}
    for group, names in GROUPS:
      names = [n for n in names if n in layers]
      if not names:
        continue
      if not fuse:
        for n in names:
          lp[n] = {k: _cast(materialize(jax.tree.map(lambda a: a[i], v), dtype), dtype)
                   for k, v in layers[n].items()}
        continue
      w = jnp.concatenate([materialize(jax.tree.map(lambda a: a[i], layers[n]["kernel"]), dtype) for n in names],
                          axis=1)
      entry = {"kernel_t": w.T} if transpose else {"kernel": w}
      if any("bias" in layers[n] for n in names):
        entry["bias"] = jnp.concatenate(
            [layers[n]["bias"][i].astype(dtype) if "bias" in layers[n]
             else jnp.zeros((layers[n]["kernel"].shape[-1],), dtype) for n in names])
      lp[group] = entry
    out.append(lp)
  return out


def init_unrolled_cache(config: ModelConfig, batch: int, max_len: int, dtype=jnp.bfloat16) -> dict:
  """Per-layer KV cache: k, v tuples of L zeros [B, Hkv, S, Dh]; mask [B, S] bool; pos [B, S] int32;
  index (next slot) — the fields of `decoder.init_cache` with per-layer k / v."""
  shape = (batch, config.num_kv_heads, max_len, config.head_dim)
  return {"k": tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
          "v": tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
          "mask": jnp.zeros((batch, max_len), jnp.bool_), "pos": jnp.zeros((batch, max_len), jnp.int32),
          "index": jnp.zeros((), jnp.int32)}


def _project(x, lp, group, names, sizes, lora, scale, dtype):
  """[x @ W_n + b_n + (x @ a_n) @ b_n * scale for n in names] for x [..., in] (rows flattened to M)."""
  lead = x.shape[:-1]
  x2 = x.reshape(-1, x.shape[-1])
  if group in lp:
    p = lp[group]
    if "kernel_t" in p:
      y = jax.lax.dot_general(x2, p["kernel_t"], (((1,), (1,)), ((), ())))
    else:  # [in, out]: a dense fused group, or the one quantised linear of a group ("o", "down")
      y = matmul(x2, p["kernel"], dtype)
    if "bias" in p:
      y = y + p["bias"].astype(dtype)
    ys = jnp.split(y, np.cumsum(sizes)[:-1].tolist(), axis=-1) if len(names) > 1 else [y]
  else:
    ys = []
    for n in names:
      y = matmul(x2, lp[n]["kernel"], dtype)
      if "bias" in lp[n]:
        y = y + lp[n]["bias"].astype(dtype)
      ys.append(y)
  out = []
  for n, y in zip(names, ys):
    y = y.reshape(*lead, y.shape[-1])
    if lora is not None and n in lora:
      y = y + lora_up(lora_down(x, lora[n]["a"], dtype), lora[n]["b"], scale, dtype)
    out.append(y)
  return out


def forward_unrolled(dparams: dict, config: ModelConfig, tokens: jnp.ndarray, cache: dict, *, positions,
                     attention_mask, lora=None, lora_scale: float = 1.0, dtype=jnp.float32,
                     paged_kernel: str = "gather"):
  """(final-norm hidden [B, T, H], new cache): `decoder.forward_hidden` with a cache, layers unrolled.

  dparams from `prepare_unrolled`, cache from `init_unrolled_cache` or a paged cache (as
  `forward_hidden`'s, with `paged_kernel`); tokens, positions, attention_mask [B, T] as `forward_hidden`;
  lora the stacked adapters {name: {"a": [L, in, r], "b": [L, r, out]}} (or per-row adapters, as
  `decoder.forward_hidden`'s). With the static cache the block
  is written at slots [index, index + T) and attends to every earlier valid slot plus itself causally.
  """
  c = config
  b, t = tokens.shape
  attention_mask = attention_mask.astype(jnp.bool_)
  positions = positions.astype(jnp.int32)
  x = dparams["embed"][tokens].astype(dtype)
  if c.embed_scale:
    x = x * jnp.asarray(c.hidden_size ** 0.5, dtype)
  paged = is_paged(cache)
  if not paged:
    index, kv_mask, key_pos, mask, self_mask = cache_masks(cache, attention_mask, positions)
    dist = positions[:, :, None] - key_pos[:, None, :] if c.has_sliding else None
  inv_freqs, rope_factors = layer_rope(c, positions)
  scale = c.head_dim ** -0.5 if c.query_pre_attn_scalar is None else c.query_pre_attn_scalar ** -0.5
  act = ACTIVATIONS[c.hidden_act]
  norm = lambda x_, w_: rms_norm(x_, w_, c.rms_norm_eps, c.norm_offset)
  nq, nkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  ks, vs = (cache["k"], cache["v"]) if paged else (list(cache["k"]), list(cache["v"]))
  quantized = dparams.get("quantized", {})
  for i, (lp, window) in enumerate(zip(dparams["layers"], c.layer_windows())):
    if quantized:  # layer i of the stacked quantised linears (the slice fuses into the dequantisation)
      lp = {**lp, **{n: _layer(p, i) for n, p in quantized.items()}}
    ll = None if lora is None else {n: {"a": ab["a"][i], "b": ab["b"][i]} for n, ab in lora.items()}
    h = norm(x, lp["attn_norm"])
    q, k, v = _project(h, lp, "qkv", ("q", "k", "v"), (nq, nkv, nkv), ll, lora_scale, dtype)
    q = q.reshape(b, t, c.num_heads, c.head_dim)
    k = k.reshape(b, t, c.num_kv_heads, c.head_dim)
    v = v.reshape(b, t, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
      q = norm(q, lp["q_norm"])
      k = norm(k, lp["k_norm"])
    q = apply_rope(q, positions, inv_freqs[i], rope_factors[i])
    k = apply_rope(k, positions, inv_freqs[i], rope_factors[i])
    if paged:
      bt = cache["block_table"]
      ks = write_pages(ks, i, k, bt, positions, attention_mask, c.num_layers)
      vs = write_pages(vs, i, v, bt, positions, attention_mask, c.num_layers)
      attn = paged_attention(q, ks, vs, i, bt, positions, window or None, scale,
                             c.attn_logit_softcapping, num_layers=c.num_layers, kernel=paged_kernel)
    else:
      ks[i] = jax.lax.dynamic_update_slice(ks[i], k.astype(ks[i].dtype).transpose(0, 2, 1, 3), (0, 0, index, 0))
      vs[i] = jax.lax.dynamic_update_slice(vs[i], v.astype(vs[i].dtype).transpose(0, 2, 1, 3), (0, 0, index, 0))
      m = mask
      if dist is not None and window:
        m = m & (dist < window)
      m = m | self_mask
      attn = grouped_attention(q, ks[i].astype(dtype), vs[i].astype(dtype), m, scale, c.attn_logit_softcapping,
                               kv_layout="bksd")
    (o,) = _project(attn.reshape(b, t, nq), lp, "o", ("o",), (c.hidden_size,), ll, lora_scale, dtype)
    x = x + (norm(o, lp["post_attn_norm"]) if c.sandwich_norms else o)
    h = norm(x, lp["mlp_norm"])
    g, u = _project(h, lp, "gate_up", ("gate", "up"), (c.intermediate_size,) * 2, ll, lora_scale, dtype)
    (y,) = _project(act(g) * u, lp, "down", ("down",), (c.hidden_size,), ll, lora_scale, dtype)
    x = x + (norm(y, lp["post_mlp_norm"]) if c.sandwich_norms else y)
  x = norm(x, dparams["final_norm"])
  if paged:
    return x, {"k": ks, "v": vs, "block_table": cache["block_table"]}
  return x, {"k": tuple(ks), "v": tuple(vs), "mask": kv_mask, "pos": key_pos, "index": index + t}
