"""Jitted device functions of the sampler: feed a block of tokens into the KV cache, decode a chunk.

State between calls ("pending token" scheme): every row has one `pending` token that is part of its
sequence but not yet in the cache, at position `pos`. A decode step feeds `pending` at the shared slot
`cache["index"]` (valid only for active rows), samples the next token from its logits and makes that the
new pending token. Prefill and `append` feed everything but the last token as a block; the last token
becomes pending. So no logits are carried between calls and the prompt's logits are never materialised.

Both functions donate the cache (updated in place) and are compiled once per (static settings, shapes);
callers round shapes up to buckets (`bucket`). `impl` (static) picks the decoder: "scan" runs
`decoder.forward_hidden` (layers scanned over the stacked params, cache of `decoder.init_cache`);
"unrolled" runs `unrolled.forward_unrolled` (params from `prepare_unrolled`, cache of
`init_unrolled_cache`): the layers unrolled over per-layer weights read in place, fused q/k/v and gate/up.
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

from fineflax.models.decoder import forward_hidden, logits_from_hidden
from fineflax.models.unrolled import forward_unrolled, prepare_unrolled
from fineflax.engine.processors import SamplingConfig, sample_tokens
from fineflax.quant import dequantize_params


def bucket(n: int, minimum: int = 16, multiple: int = 256) -> int:
  """n rounded up: to a power of two (at least `minimum`) up to `multiple`, then to a multiple of it."""
  n = max(int(n), minimum)
  if n <= multiple:
    return 1 << (n - 1).bit_length()
  return -(-n // multiple) * multiple


DECODE_IMPLS = ("auto", "unrolled", "scan")


def decode_impl(preference: str | None = "auto", backend: str | None = None) -> str:
  """The decoder of the sampler: `preference` when "unrolled" or "scan"; for "auto" / None the
  environment variable FINEFLAX_DECODE=unrolled|scan if set, else "unrolled" on GPUs (`backend`,
  default `jax.default_backend()`) and "scan" elsewhere (on CPU the scan measured faster)."""
  preference = preference or "auto"
  if preference == "auto":
    backend = backend or jax.default_backend()
    preference = os.environ.get("FINEFLAX_DECODE") or ("unrolled" if backend == "gpu" else "scan")
  if preference not in DECODE_IMPLS[1:]:
    raise ValueError(f"decode impl {preference!r}; choose one of {DECODE_IMPLS}")
  return preference


def hidden_states(impl, params, config, tokens, cache, **kwargs):
  """(hidden [B, T, H], cache) of the chosen decoder."""
  if impl == "unrolled":
    return forward_unrolled(params, config, tokens, cache, **kwargs)
  return forward_hidden(params, config, tokens, cache=cache, **kwargs)


def resolve_eos_ids(eos_ids, config, tokenizer=None) -> tuple[int, ...]:
  """Sorted distinct EOS ids: `eos_ids`, or for None the config's plus the tokenizer's EOS id."""
  if eos_ids is None:
    eos_ids = list(config.eos_token_ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
      eos_ids.append(tokenizer.eos_token_id)
  return tuple(sorted({int(t) for t in eos_ids}))


def prepare_decode_params(params, config, impl: str, dtype, dense_base: bool = False, fuse: bool = True):
  """The params a decoder reads: "unrolled" re-lays the weights out once (`prepare_unrolled`: an extra
  copy of the dense weights; fuse=False keeps the linears apart, as tensor parallelism needs);
  dense_base=True decodes a quantised base from a `dtype` copy of its dequantised weights (same weights, a
  dense kernel's speed, the memory of that copy)."""
  if impl == "unrolled":
    return prepare_unrolled(params, config, dtype, dequantize=dense_base, fuse=fuse)
  return dequantize_params(params, dtype) if dense_base else params


def cast_params(params, dtype):
  """Floating arrays cast to `dtype`; quantised tensors (with `.dequantize`) left as they are."""
  def cast(x):
    if hasattr(x, "dequantize") or not hasattr(x, "dtype"):
      return x
    return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
  return jax.tree.map(cast, params, is_leaf=lambda x: hasattr(x, "dequantize"))


@functools.partial(jax.jit, static_argnames=("config", "dtype", "impl"), donate_argnames=("cache",))
def feed_block(params, cache, tokens, attention_mask, positions, lora, lora_scale, *, config, dtype,
               impl: str = "scan"):
  """Writes tokens [B, T] at slots [index, index + T) of the cache; returns the new cache.

  attention_mask [B, T]: 1 = real token (0 slots stay invisible forever); positions [B, T].
  """
  params = cast_params(params, dtype)
  _, cache = hidden_states(impl, params, config, tokens, cache, positions=positions,
                     attention_mask=attention_mask, lora=lora, lora_scale=lora_scale, dtype=dtype)
  return cache


@functools.partial(jax.jit, static_argnames=("config", "dtype", "sampling", "num_steps", "impl"),
                   donate_argnames=("cache",))
def decode_chunk(params, cache, state, rng, eos_ids, lora, lora_scale, *, config, dtype,
                 sampling: SamplingConfig, num_steps: int, impl: str = "scan"):
  """Runs up to `num_steps` decode steps under `lax.while_loop`, stopping early once no row is active.

  state: {pending int32 [B], pos int32 [B], active bool [B], budget int32 [B] (tokens still allowed)}.
  Per step, for active rows: y ~ sample(logits(pending at pos)); pending <- y; pos += 1; budget -= 1;
  a row stops when y is in `eos_ids` (int32 [E], -1 = unused entry; eos[b] = True) or its budget is 0.
  Returns (cache, state, eos [B], out) with out = {tokens, logprobs, raw_logprobs: [B, num_steps],
  emitted bool [B, num_steps] (row was active at that step), steps: int32 (steps run)}.
  """
  params = cast_params(params, dtype)

  def step_fn(cache, st, step):
    h, cache = hidden_states(impl, params, config, st["pending"][:, None], cache, positions=st["pos"][:, None],
                       attention_mask=st["active"][:, None], lora=lora, lora_scale=lora_scale, dtype=dtype)
    logits = logits_from_hidden(params, config, h)
    return (cache, *sample_tokens(logits[:, 0], jax.random.fold_in(rng, step), sampling))

  return decode_loop(step_fn, cache, state, eos_ids, num_steps)


def decode_loop(step_fn, cache, state: dict, eos_ids, num_steps: int):
  """The decode steps of a chunk under `lax.while_loop`, stopping early once no row is active.

  step_fn(cache, state, step) -> (cache, tokens [B], logprobs [B], raw_logprobs [B]): one forward of every
  row's pending token and its sample. state: pending, pos, active, budget [B] (and count [B], if present:
  tokens sampled so far). Per step, for active rows: pending <- y; pos += 1; budget -= 1; count += 1; a row
  stops when y is one of `eos_ids` (int32 [E] shared or [B, E] per row; -1 = unused) or its budget is 0.
  Returns (cache, state, eos [B], out) with out = {tokens, logprobs, raw_logprobs: [B, num_steps],
  emitted bool [B, num_steps] (row was active at that step), steps: int32 (steps run)}.
  """
  b = state["pending"].shape[0]
  eos_ids = eos_ids if eos_ids.ndim == 2 else eos_ids[None, :]
  out = {"tokens": jnp.zeros((b, num_steps), jnp.int32),
         "logprobs": jnp.zeros((b, num_steps), jnp.float32),
         "raw_logprobs": jnp.zeros((b, num_steps), jnp.float32),
         "emitted": jnp.zeros((b, num_steps), jnp.bool_)}

  def cond(carry):
    step, _, st, _, _ = carry
    return (step < num_steps) & jnp.any(st["active"])

  def body(carry):
    step, cache, st, eos, out = carry
    active = st["active"]
    cache, tok, lp, raw = step_fn(cache, st, step)
    tok = jnp.where(active, tok, 0)
    col = lambda buf, v: jax.lax.dynamic_update_slice(buf, v[:, None].astype(buf.dtype), (0, step))
    out = {"tokens": col(out["tokens"], tok), "logprobs": col(out["logprobs"], jnp.where(active, lp, 0.0)),
           "raw_logprobs": col(out["raw_logprobs"], jnp.where(active, raw, 0.0)),
           "emitted": col(out["emitted"], active)}
    hit_eos = active & jnp.any(tok[:, None] == eos_ids, axis=1)
    inc = active.astype(jnp.int32)
    budget = st["budget"] - inc
    st = dict(st, pending=jnp.where(active, tok, st["pending"]), pos=st["pos"] + inc,
              active=active & ~hit_eos & (budget > 0), budget=budget)
    if "count" in st:
      st["count"] = st["count"] + inc
    return step + 1, cache, st, eos | hit_eos, out

  init = (jnp.zeros((), jnp.int32), cache, state, jnp.zeros((b,), jnp.bool_), out)
  steps, cache, state, eos, out = jax.lax.while_loop(cond, body, init)
  out["steps"] = steps
  return cache, state, eos, out
