"""One pure-functional decoder for the Llama family (Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM2), Gemma 2 /
Gemma 3 text and Phi-3.

Parameter pytree (layers stacked on a leading axis L and run under `jax.lax.scan`, or a Python loop over
per-layer slices with `config.layer_loop == "unrolled"`: see `layer_loop.run_layers`):

  embed            [V, H]
  layers/attn_norm [L, H]          layers/mlp_norm [L, H]
  layers/{q,k,v,o,gate,up,down}/kernel  [L, in, out]    (y = x @ kernel)
  layers/{name}/bias   [L, out]    (per `config.bias_names()`: q/k/v Qwen2, o attention_bias, MLP mlp_bias)
  layers/{q_norm,k_norm} [L, Dh]   (Qwen3, Gemma 3)
  layers/{post_attn_norm,post_mlp_norm} [L, H]  (Gemma sandwich norms; mlp_norm is pre-feed-forward)
  final_norm       [H]
  lm_head/kernel   [H, V]          (absent when embeddings are tied)

A `kernel` leaf may be a quantised tensor: anything with `.dequantize(dtype)` (see `fineflax.quant`).
LoRA adapters are a pytree `{name: {"a": [L, in, r], "b": [L, r, out]}}` over the same names:
y = x @ W + dropout(x) @ a @ b * lora_scale. Per-row adapters (serving several in one batch): a [L, A, in, r],
b [L, A, r, out] (A adapters stacked, `fineflax.engine.adapters`) with lora_scale [B, A] (row weights):
row b adds sum_i lora_scale[b, i] x @ a_i @ b_i (`lora_down` / `lora_up`).
"""
from __future__ import annotations

import itertools
import os
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from fineflax.models.attention import grouped_attention, softcap
from fineflax.models.config import ModelConfig
from fineflax.models.head import (final_logit_softcap, logits_from_hidden, output_kernel,  # noqa: F401 (re-exported)
                                  project_logits)
from fineflax.models.layer_loop import run_layers
from fineflax.models.paged import is_paged, paged_attention, write_pages
from fineflax.models.remat import (LAYER_INPUT, REMAT_NAMED, REMAT_NAMES, REMAT_POLICIES,  # noqa: F401 (re-exported)
                                   remat_policy, remat_saved_names)
from fineflax.models.rope import apply_rope, layer_rope
from fineflax.quant.matmul import materialize, quantized_matmul  # noqa: F401 (materialize re-exported)

LINEAR_NAMES = ("q", "k", "v", "o", "gate", "up", "down")

Params = dict[str, Any]


def init_params(config: ModelConfig, rng: jax.Array, dtype=jnp.float32, std: float = 0.02) -> Params:
  """Random weights N(0, std) for linears and embeddings, ones for norms (like HF `_init_weights`)."""
  c, L = config, config.num_layers
  shapes = c.linear_shapes()
  keys = iter(jax.random.split(rng, len(shapes) + 2))
  normal = lambda shape: (std * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)
  layers: Params = {n: {"kernel": normal((L, *s))} for n, s in shapes.items()}
  for n in c.bias_names():
    layers[n]["bias"] = jnp.zeros((L, shapes[n][1]), dtype)
  one = 1.0 - c.norm_offset  # a unit norm scale: w = 1, or w = 0 under (1 + w)
  for n in c.vector_names():
    layers[n] = jnp.full((L, c.head_dim if n in ("q_norm", "k_norm") else c.hidden_size), one, dtype)
  params = {"embed": normal((c.vocab_size, c.hidden_size)), "layers": layers,
            "final_norm": jnp.full((c.hidden_size,), one, dtype)}
  if not c.tie_word_embeddings:
    params["lm_head"] = {"kernel": normal((c.hidden_size, c.vocab_size))}
  return params


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype=jnp.bfloat16) -> dict:
  """KV cache: k, v [L, B, S, Hkv, Dh]; mask [B, S] (slot holds a real token); pos [B, S] (the slot's
  position, for sliding windows); index (next slot). Sliding layers mask keys outside their window (the
  cache is not a ring buffer: memory is max_len for every layer)."""
  shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype),
          "mask": jnp.zeros((batch, max_len), jnp.bool_), "pos": jnp.zeros((batch, max_len), jnp.int32),
          "index": jnp.zeros((), jnp.int32)}


def cache_masks(cache: dict, attention_mask, positions):
  """Masks of T new tokens written at slots [index, index + T) of a KV cache: (index, kv_mask [B, S] (slot
  holds a real token), key_pos [B, S] (slot positions), mask [B, T, S] (causal over slots and real keys),
  self_mask [1, T, S] (each token's own slot, so that a padding query still sees one key))."""
  t = attention_mask.shape[1]
  index = cache["index"]
  kv_mask = jax.lax.dynamic_update_slice(cache["mask"], attention_mask, (0, index))
  key_pos = jax.lax.dynamic_update_slice(cache["pos"], positions, (0, index))
  slots = jnp.arange(kv_mask.shape[1])
  causal = slots[None, :] <= (index + jnp.arange(t))[:, None]
  mask = causal[None] & kv_mask[:, None, :]
  self_mask = (slots[None, :] == (index + jnp.arange(t))[:, None])[None]
  return index, kv_mask, key_pos, mask, self_mask


def matmul(x: jnp.ndarray, w, dtype) -> jnp.ndarray:
  """x @ W in `dtype` for a kernel leaf W: a cast array, or a quantised tensor through
  `fineflax.quant.quantized_matmul` (its dense copy is never kept for the backward pass)."""
  if not hasattr(w, "dequantize"):
    return x @ w.astype(dtype)
  return quantized_matmul(x, w, dtype)


def rms_norm(x: jnp.ndarray, weight: jnp.ndarray, eps: float, offset: float = 0.0) -> jnp.ndarray:
  """x / sqrt(mean(x^2) + eps) * (offset + weight), in f32 (offset 1 for Gemma's (1 + w) norms)."""
  xf = x.astype(jnp.float32)
  xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return ((offset + weight.astype(jnp.float32)) * xf).astype(x.dtype)


ACTIVATIONS = {"silu": jax.nn.silu, "relu": jax.nn.relu,
               "gelu": lambda x: jax.nn.gelu(x, approximate=False),
               "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


def default_positions(attention_mask: jnp.ndarray) -> jnp.ndarray:
  """Positions that honour left padding: cumsum(mask) - 1, clipped at 0."""
  return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def _linear(x, p, lora_p, scale, dtype, dropout_rate, key, xa=None):
  """x @ W (+ bias) + (dropout(x) @ a) @ b * scale; `xa` = x @ a when the caller computed it already."""
  y = matmul(x, p["kernel"], dtype)
  if "bias" in p:
    y = y + p["bias"].astype(dtype)
  if lora_p is not None:
    if xa is None:
      xl = x
      if dropout_rate > 0.0 and key is not None:
        keep = jax.random.bernoulli(key, 1.0 - dropout_rate, x.shape)
        xl = jnp.where(keep, x / (1.0 - dropout_rate), 0).astype(x.dtype)
      xa = lora_down(xl, lora_p["a"], dtype)
    y = y + lora_up(xa, lora_p["b"], scale, dtype)
  return y


def lora_down(x, a, dtype):
  """x @ a for one adapter's a [in, r]. Per-row adapters (a layer's a [A, in, r], A adapters stacked,
  see `fineflax.engine.adapters`): every adapter's x @ a_i, [..., A, r] (the activations are selected
  per row in `lora_up`, not the weights: no per-row copy of the adapters is read)."""
  if a.ndim == 3:
    return jnp.einsum("...i,air->...ar", x, a.astype(dtype))
  return x @ a.astype(dtype)


def lora_up(xa, b, scale, dtype):
  """(xa @ b) * scale for one adapter (b [r, out], scale a scalar). Per-row adapters (b [A, r, out], xa
  [B, T, A, r], scale [B, A]: row b's weight of adapter i, scale_i for its own adapter, 0 for the others):
  sum_i scale[b, i] (xa_i @ b_i), i.e. row b's adapter alone."""
  if b.ndim == 3:
    return jnp.einsum("btar,aro->bto", xa * scale[:, None, :, None].astype(dtype), b.astype(dtype))
  return (xa @ b.astype(dtype)) * jnp.asarray(scale, dtype)


def _lora_down(x, lora_layer, names, dtype) -> dict:
  """{name: x @ a_name} for linears that read the same input x (q/k/v, gate/up), from one matmul on the
  concatenated a's: x is read once (and its gradient written once) instead of once per adapter. Same
  values as the separate products. {} unless every name has an adapter."""
  if lora_layer is None or not all(n in lora_layer for n in names):
    return {}
  a = jnp.concatenate([lora_layer[n]["a"].astype(dtype) for n in names], axis=-1)
  bounds = list(itertools.accumulate(lora_layer[n]["a"].shape[-1] for n in names))[:-1]
  return dict(zip(names, jnp.split(lora_down(x, a, dtype), bounds, axis=-1)))


ATTENTION_IMPLS = ("auto", "cudnn", "xla")


def attention_impl(dtype, preference: str = "auto") -> str:
  """The attention kernel: `preference` (ModelConfig.attention, from `config.model.attention`) when it
  is "cudnn" or "xla"; for "auto" the environment variable FINEFLAX_ATTENTION=xla|cudnn if set, else
  "cudnn" (fused flash attention) on GPUs for bf16/f16 compute and "xla" (einsum + softmax) otherwise.
  """
  if preference not in ATTENTION_IMPLS:
    raise ValueError(f"attention={preference!r}; choose one of {ATTENTION_IMPLS}")
  if preference != "auto":
    return preference
  forced = os.environ.get("FINEFLAX_ATTENTION")
  if forced:
    return forced
  low_precision = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  return "cudnn" if jax.default_backend() == "gpu" and low_precision else "xla"


def _attention(q, k, v, mask, impl: str = "xla", scale: float | None = None, cap: float | None = None):
  """Grouped-query attention. q [B,T,Hq,D], k/v [B,S,Hkv,D], mask [B,T,S] bool -> [B,T,Hq,D].

  scores = softcap(q.k * scale, cap), scale default D^-0.5. Every query row must attend to at least one
  key (the callers always allow the token itself). mask None means plain causal (T == S): cuDNN then runs
  its causal kernel (no [B,1,T,S] bias to read, no bias gradient to write, masked tiles skipped).
  """
  b, t, hq, d = q.shape
  scale = d ** -0.5 if scale is None else scale
  if impl == "cudnn" and cap is None:
    if mask is None:
      return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, implementation="cudnn")
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=scale, implementation="cudnn")
  if mask is None:
    mask = jnp.tril(jnp.ones((t, k.shape[1]), jnp.bool_))[None]
  return grouped_attention(q, k, v, mask, scale, cap)


def forward_hidden(params: Params, config: ModelConfig, tokens: jnp.ndarray, *,
                   positions=None, attention_mask=None, segment_ids=None, cache=None, lora=None,
                   lora_scale: float = 1.0, lora_dropout: float = 0.0, dropout_rng=None,
                   remat: str = "none", dtype=jnp.float32, causal_prefix: bool = False,
                   paged_kernel: str = "gather"):
  """Final-norm hidden states [B, T, H] (and the updated cache when `cache` is given).

  tokens [B, T]; attention_mask [B, T] (1 = real token; default all ones); positions [B, T]
  (default `default_positions(attention_mask)`). segment_ids [B, T] (packed sequences, no cache):
  a token attends only to earlier tokens of its own segment. With a static cache (`init_cache`) the
  block is written at slots [index, index + T) and attends to every earlier valid slot plus itself
  causally. With a paged cache (`fineflax.models.paged`: pools k / v and a block table [B, n]) each real
  token is written at its own position of its row's pages and attends to its row's positions <= its own
  (positions are required: a row's real tokens are at consecutive positions after those in its pages);
  `paged_kernel` ("gather" | "pallas" | "paged_decode" | a `paged_decode.DecodeKernel`) picks the attention over pages.

  causal_prefix=True (no cache, no segment_ids) promises that each row is one sequence whose real tokens
  are a prefix (right padding, as `fineflax.data` batches without packing are). Attention is then plain
  causal: outputs at real tokens are unchanged (they never see the padding after them); padded positions
  may attend to earlier padding (their outputs differ, and carry no loss). On GPUs this selects cuDNN's
  causal kernel instead of one reading a [B, 1, T, T] mask bias.
  """
  c = config
  b, t = tokens.shape
  if attention_mask is None:
    attention_mask = jnp.ones((b, t), jnp.bool_)
  attention_mask = attention_mask.astype(jnp.bool_)
  if positions is None:
    if is_paged(cache):
      raise ValueError("a paged cache needs the tokens' positions (forward_hidden(positions=...))")
    positions = default_positions(attention_mask)
  positions = positions.astype(jnp.int32)
  x = params["embed"][tokens].astype(dtype)
  if c.embed_scale:
    x = x * jnp.asarray(c.hidden_size ** 0.5, dtype)

  if causal_prefix and (cache is not None or segment_ids is not None):
    raise ValueError("causal_prefix=True takes no cache and no segment_ids (one right-padded sequence a row)")
  paged = is_paged(cache)
  if paged:
    if segment_ids is not None:
      raise ValueError("segment_ids (packing) cannot be combined with a KV cache")
    bt, impl, index, dist = cache["block_table"], "xla", None, None
  elif cache is None:
    causal = jnp.tril(jnp.ones((t, t), jnp.bool_))
    mask = causal[None] & attention_mask[:, None, :]
    if segment_ids is not None:
      mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
    self_mask = jnp.eye(t, dtype=jnp.bool_)[None]  # padding queries see themselves: no empty rows
    key_pos = positions
    index = None
    impl = attention_impl(dtype, config.attention)
  else:
    if segment_ids is not None:
      raise ValueError("segment_ids (packing) cannot be combined with a KV cache")
    index, kv_mask, key_pos, mask, self_mask = cache_masks(cache, attention_mask, positions)
    impl = "xla"
  # sliding layers: a query at position p sees keys at positions (p - window, p]
  windows = jnp.asarray(c.layer_windows(), jnp.int32)
  if not paged:
    dist = positions[:, :, None] - key_pos[:, None, :] if c.has_sliding else None
  inv_freqs, rope_factors = layer_rope(c, positions)
  scale = None if c.query_pre_attn_scalar is None else c.query_pre_attn_scalar ** -0.5
  act = ACTIVATIONS[c.hidden_act]
  norm = lambda x_, w_: rms_norm(x_, w_, c.rms_norm_eps, c.norm_offset)

  layers = params["layers"]
  keys = (jax.random.split(dropout_rng, c.num_layers) if (dropout_rng is not None and lora_dropout > 0)
          else None)

  def layer(carry, xs):
    x, ck, cv = carry
    x = checkpoint_name(x, LAYER_INPUT)  # what remat "offload" moves to host memory
    i, lp, ll, key, window, inv_freq, rope_factor = xs
    lin_keys = iter(jax.random.split(key, len(LINEAR_NAMES))) if key is not None else None
    def lin(name, inp, shared=None):
      k_ = next(lin_keys) if lin_keys is not None else None
      return _linear(inp, lp[name], None if ll is None else ll.get(name), lora_scale, dtype,
                     lora_dropout, k_, None if shared is None else shared.get(name))
    # without dropout the adapters of linears with one input share their down-projection matmul
    grouped = lambda names, inp: {} if lin_keys is not None else _lora_down(inp, ll, names, dtype)
    h = norm(x, lp["attn_norm"])
    xa = grouped(("q", "k", "v"), h)
    q = lin("q", h, xa).reshape(b, t, c.num_heads, c.head_dim)
    k = lin("k", h, xa).reshape(b, t, c.num_kv_heads, c.head_dim)
    v = lin("v", h, xa).reshape(b, t, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
      q = norm(q, lp["q_norm"])
      k = norm(k, lp["k_norm"])
    q = checkpoint_name(apply_rope(q, positions, inv_freq, rope_factor), "qkv")  # names: REMAT_NAMES
    k = checkpoint_name(apply_rope(k, positions, inv_freq, rope_factor), "qkv")
    v = checkpoint_name(v, "qkv")
    if paged:
      ck = write_pages(ck, i, k, bt, positions, attention_mask, c.num_layers)
      cv = write_pages(cv, i, v, bt, positions, attention_mask, c.num_layers)
      attn = paged_attention(q, ck, cv, i, bt, positions, window if c.has_sliding else None,
                             c.head_dim ** -0.5 if scale is None else scale, c.attn_logit_softcapping,
                             num_layers=c.num_layers, kernel=paged_kernel)
    else:
      if ck is not None:
        ck = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype)[None], (i, 0, index, 0, 0))
        cv = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype)[None], (i, 0, index, 0, 0))
        k_all = jax.lax.dynamic_index_in_dim(ck, i, keepdims=False).astype(dtype)
        v_all = jax.lax.dynamic_index_in_dim(cv, i, keepdims=False).astype(dtype)
      else:
        k_all, v_all = k, v
      if causal_prefix and dist is None:
        m = None  # plain causal (see the docstring)
      else:
        m = mask
        if dist is not None:
          m = m & ((window == 0) | (dist < window))
        m = m | self_mask
      attn = _attention(q, k_all, v_all, m, impl, scale, c.attn_logit_softcapping)
    attn = checkpoint_name(attn, "attn")
    o = lin("o", attn.reshape(b, t, c.num_heads * c.head_dim))
    x = x + (norm(o, lp["post_attn_norm"]) if c.sandwich_norms else o)
    h = norm(x, lp["mlp_norm"])
    xa = grouped(("gate", "up"), h)
    gate, up = checkpoint_name(lin("gate", h, xa), "gate"), checkpoint_name(lin("up", h, xa), "up")
    y = lin("down", checkpoint_name(act(gate) * up, "mlp"))
    x = x + (norm(y, lp["post_mlp_norm"]) if c.sandwich_norms else y)
    return (x, ck, cv), None

  policy = remat_policy(remat)
  if remat != "none":
    layer = jax.checkpoint(layer, policy=policy)
  ck = cv = None if cache is None else cache["k"]
  cv = None if cache is None else cache["v"]
  xs = (jnp.arange(c.num_layers), layers, lora, keys, windows, inv_freqs, rope_factors)
  x, ck, cv = run_layers(layer, (x, ck, cv), xs, c.num_layers, c.layer_loop)
  x = norm(x, params["final_norm"])
  if cache is None:
    return x
  if paged:
    return x, {"k": ck, "v": cv, "block_table": bt}
  return x, {"k": ck, "v": cv, "mask": kv_mask, "pos": key_pos, "index": index + t}


def forward(params: Params, config: ModelConfig, tokens: jnp.ndarray, **kwargs) -> jnp.ndarray:
  """Logits [B, T, V] (f32). Keyword arguments as `forward_hidden`, without a cache."""
  if kwargs.get("cache") is not None:
    raise ValueError("forward() takes no cache; use forward_cached()")
  return logits_from_hidden(params, config, forward_hidden(params, config, tokens, **kwargs))


def forward_cached(params: Params, config: ModelConfig, tokens: jnp.ndarray, cache: dict, **kwargs):
  """(logits [B, T, V], new cache): appends the block to the KV cache (see `forward_hidden`)."""
  h, cache = forward_hidden(params, config, tokens, cache=cache, **kwargs)
  return logits_from_hidden(params, config, h), cache
