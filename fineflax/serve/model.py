"""The decoder over a slot cache: per-row write positions and per-row LoRA adapters (for the server).

Slot cache: k, v [L, N, S, Hkv, Dh] (N decode slots, S context). Row n's token at position p lives in slot
p of row n, so a row sees exactly the slots s <= its query's position: everything there was written by
the row's own prompt and completion (its prefill starts at position 0), and a slot is always written
before a query of the row can see it. No mask array is kept; a freed row is simply overwritten.

Per-row LoRA (several adapters in one batch): for every linear, the adapters' factors are concatenated
along the rank axis, a_cat [L, in, R], b_cat [L, R, out], with owner [R] = the adapter id (1..A) of each
rank column. Row b with adapter id i (0 = the base, no adapter) computes

  y = x @ W + (((x @ a_cat) * [owner == i]) @ b_cat) * scale_i

which is exactly x @ W + ((x @ a_i) @ b_i) * scale_i: the other adapters' columns are multiplied by 0.
Adapters may differ in rank, targets and scale.
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fineflax.lora import LoraConfig, lora_scale
from fineflax.models.decoder import (LINEAR_NAMES, _attention, logits_from_hidden, matmul,
                                     rms_norm)
from fineflax.models.rope import apply_rope, inv_frequencies
from fineflax.engine.decode import cast_params


def init_slot_cache(config, slots: int, context: int, dtype=jnp.bfloat16) -> dict:
  """k, v zeros [L, slots, context, Hkv, Dh]."""
  shape = (config.num_layers, slots, context, config.num_kv_heads, config.head_dim)
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def stack_adapters(adapters: Sequence[tuple[dict, LoraConfig]]) -> dict | None:
  """Per-row LoRA pytree from [(lora, cfg), ...] (adapter ids 1..A in that order); None when empty.

  Returns {"scale": f32 [A + 1] (scale[0] = 0), "linears": {name: {"a": [L, in, R], "b": [L, R, out],
  "owner": int32 [R]}}} (see the module docstring).
  """
  if not adapters:
    return None
  scales = [0.0] + [float(lora_scale(cfg)) for _, cfg in adapters]
  linears = {}
  for name in LINEAR_NAMES:
    parts = [(i + 1, lora[name]) for i, (lora, _) in enumerate(adapters) if name in lora]
    if not parts:
      continue
    linears[name] = {
        "a": jnp.concatenate([jnp.asarray(ab["a"], jnp.float32) for _, ab in parts], axis=-1),
        "b": jnp.concatenate([jnp.asarray(ab["b"], jnp.float32) for _, ab in parts], axis=-2),
        "owner": jnp.asarray(np.concatenate([np.full(ab["a"].shape[-1], i, np.int32) for i, ab in parts])),
    }
  return {"scale": jnp.asarray(scales, jnp.float32), "linears": linears}


def _rowwise_lora(x, ab, onehot_rank, row_scale, dtype):
  """(((x @ a_cat) * onehot_rank) @ b_cat) * row_scale for x [B, T, in]; onehot_rank [B, R]."""
  h = x @ ab["a"].astype(dtype)
  h = h * onehot_rank[:, None, :].astype(dtype)
  return (h @ ab["b"].astype(dtype)) * row_scale[:, None, None].astype(dtype)


def slot_forward(params, config, cache, tokens, start, *, rows=None, lora=None, lora_ids=None,
                 span: int, dtype=jnp.bfloat16):
  """(final-norm hidden [B, T, H], cache) for tokens [B, T] at positions start[b] + t of cache rows.

  rows [B] int32: the cache rows written (None = rows 0..B-1, B <= N); out-of-range rows and slots are
  dropped (padding rows: rows[b] = N). `span` (static): only slots [0, span) are attended to; every real
  query position must be < span. lora: `stack_adapters` pytree; lora_ids [B] int32 (0 = base).
  """
  c = config
  b, t = tokens.shape
  positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  inv_freq = jnp.asarray(inv_frequencies(c))
  x = params["embed"][tokens].astype(dtype)
  slots = jnp.arange(span)
  mask = slots[None, None, :] <= positions[:, :, None]  # [B, T, span]
  row_idx = jnp.arange(b) if rows is None else rows
  write_rows = row_idx[:, None] * jnp.ones((1, t), jnp.int32)
  if lora is not None:
    ids = jnp.zeros((b,), jnp.int32) if lora_ids is None else lora_ids
    row_scale = lora["scale"][ids]
    onehots = {n: (ab["owner"][None, :] == ids[:, None]) for n, ab in lora["linears"].items()}
    layer_lora = {n: {"a": ab["a"], "b": ab["b"]} for n, ab in lora["linears"].items()}
  else:
    layer_lora, onehots, row_scale = None, {}, None

  def layer(carry, xs):
    x, ck, cv = carry
    i, lp, ll = xs

    def lin(name, inp):
      p = lp[name]
      y = matmul(inp, p["kernel"], dtype)
      if "bias" in p:
        y = y + p["bias"].astype(dtype)
      if ll is not None and name in ll:
        y = y + _rowwise_lora(inp, ll[name], onehots[name], row_scale, dtype)
      return y

    h = rms_norm(x, lp["attn_norm"], c.rms_norm_eps)
    q = lin("q", h).reshape(b, t, c.num_heads, c.head_dim)
    k = lin("k", h).reshape(b, t, c.num_kv_heads, c.head_dim)
    v = lin("v", h).reshape(b, t, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
      q = rms_norm(q, lp["q_norm"], c.rms_norm_eps)
      k = rms_norm(k, lp["k_norm"], c.rms_norm_eps)
    q = apply_rope(q, positions, inv_freq)
    k = apply_rope(k, positions, inv_freq)
    ck = ck.at[i, write_rows, positions].set(k.astype(ck.dtype), mode="drop")
    cv = cv.at[i, write_rows, positions].set(v.astype(cv.dtype), mode="drop")
    k_layer = jax.lax.dynamic_index_in_dim(ck, i, keepdims=False)[:, :span]
    v_layer = jax.lax.dynamic_index_in_dim(cv, i, keepdims=False)[:, :span]
    if rows is None:
      k_layer, v_layer = k_layer[:b], v_layer[:b]
    else:
      k_layer, v_layer = k_layer[rows], v_layer[rows]  # out-of-range rows clamp (padding only)
    attn = _attention(q, k_layer.astype(dtype), v_layer.astype(dtype), mask, "xla")
    x = x + lin("o", attn.reshape(b, t, c.num_heads * c.head_dim))
    h = rms_norm(x, lp["mlp_norm"], c.rms_norm_eps)
    x = x + lin("down", jax.nn.silu(lin("gate", h)) * lin("up", h))
    return (x, ck, cv), None

  xs = (jnp.arange(c.num_layers), params["layers"], layer_lora)
  (x, ck, cv), _ = jax.lax.scan(layer, (x, cache["k"], cache["v"]), xs)
  return rms_norm(x, params["final_norm"], c.rms_norm_eps), {"k": ck, "v": cv}


@functools.partial(jax.jit, static_argnames=("config", "dtype", "span"), donate_argnames=("cache",))
def prefill_rows(params, cache, tokens, rows, lora, lora_ids, *, config, dtype, span):
  """Writes tokens [B, T] (right-padded; positions 0..T-1) into cache rows `rows` [B]; returns the cache.

  Padding tokens write slots past the prompt; those are overwritten before the row can attend to them.
  """
  params = cast_params(params, dtype)
  start = jnp.zeros((tokens.shape[0],), jnp.int32)
  _, cache = slot_forward(params, config, cache, tokens, start, rows=rows, lora=lora, lora_ids=lora_ids,
                          span=span, dtype=dtype)
  return cache


def sample_rows(logits, seeds, pos, temperature, top_p, *, use_top_p: bool):
  """(token int32 [B], raw logprob f32 [B]) from f32 logits [B, V] with per-row settings.

  temperature[b] = 0: argmax. Otherwise z = logits / T, nucleus cut at top_p[b] (tokens whose more
  likely predecessors already hold >= top_p of the mass are dropped; the top token is always kept), then
  y ~ Categorical(softmax(z)) with key fold_in(key(seed[b]), pos[b]): a row's draws depend only on its
  own seed and positions, not on the batch it shares. raw logprob = log_softmax(logits)[y].
  """
  logits = logits.astype(jnp.float32)
  greedy = temperature <= 0.0
  z = logits / jnp.where(greedy, 1.0, temperature)[:, None]
  if use_top_p:
    sorted_z = jnp.sort(z, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_z, axis=-1)
    keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p[:, None]
    threshold = jnp.min(jnp.where(keep, sorted_z, jnp.inf), axis=-1, keepdims=True)
    z = jnp.where(z < threshold, -jnp.inf, z)
  keys = jax.vmap(lambda s, p: jax.random.fold_in(jax.random.key(s), p))(seeds, pos)
  sampled = jax.vmap(jax.random.categorical)(keys, z).astype(jnp.int32)
  tok = jnp.where(greedy, jnp.argmax(logits, axis=-1).astype(jnp.int32), sampled)
  raw = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tok[:, None], axis=-1)[:, 0]
  return tok, raw


@functools.partial(jax.jit, static_argnames=("config", "dtype", "span", "num_steps", "use_top_p"),
                   donate_argnames=("cache",))
def decode_slots(params, cache, state, eos_ids, lora, *, config, dtype, span: int, num_steps: int,
                 use_top_p: bool):
  """Up to `num_steps` decode steps over cache rows 0..R-1 (R = the state's length, <= N slots; stops
  early once no row is active).

  state: pending, pos, budget int32 [R]; active, ignore_eos bool [R]; lora_ids, seed int32/uint32 [R];
  temperature, top_p f32 [R]. Per step, for active rows: y ~ sample(logits(pending at pos)); pending <- y;
  pos += 1; budget -= 1; a row stops at an EOS id (eos_ids [E], -1 = unused) or budget 0.
  Returns (cache, state, out) with out = {tokens, logprobs [R, num_steps], emitted bool [R, num_steps],
  eos bool [R]}. Positions pos + num_steps must stay below `span`.
  """
  params = cast_params(params, dtype)
  n = state["pending"].shape[0]
  out = {"tokens": jnp.zeros((n, num_steps), jnp.int32), "logprobs": jnp.zeros((n, num_steps), jnp.float32),
         "emitted": jnp.zeros((n, num_steps), jnp.bool_), "eos": jnp.zeros((n,), jnp.bool_)}

  def cond(carry):
    step, _, st, _ = carry
    return (step < num_steps) & jnp.any(st["active"])

  def body(carry):
    step, cache, st, out = carry
    active = st["active"]
    h, cache = slot_forward(params, config, cache, st["pending"][:, None], st["pos"], lora=lora,
                            lora_ids=st["lora_ids"], span=span, dtype=dtype)
    logits = logits_from_hidden(params, config, h[:, 0])
    tok, lp = sample_rows(logits, st["seed"], st["pos"], st["temperature"], st["top_p"],
                          use_top_p=use_top_p)
    tok = jnp.where(active, tok, 0)
    col = lambda buf, v: jax.lax.dynamic_update_slice(buf, v[:, None].astype(buf.dtype), (0, step))
    hit_eos = active & ~st["ignore_eos"] & jnp.any(tok[:, None] == eos_ids[None, :], axis=1)
    budget = st["budget"] - active.astype(jnp.int32)
    out = {"tokens": col(out["tokens"], tok), "logprobs": col(out["logprobs"], jnp.where(active, lp, 0.0)),
           "emitted": col(out["emitted"], active), "eos": out["eos"] | hit_eos}
    st = {**st, "pending": jnp.where(active, tok, st["pending"]), "pos": st["pos"] + active.astype(jnp.int32),
          "active": active & ~hit_eos & (budget > 0), "budget": budget}
    return step + 1, cache, st, out

  _, cache, state, out = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), cache, state, out))
  return cache, state, out
