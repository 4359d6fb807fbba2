"""XLA grouped-query attention and soft-capping: the score numerics shared by the decoder's attention
(`fineflax.models.decoder`), the unrolled decoder and the paged KV cache (`fineflax.models.paged`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG = -1e30


def softcap(x: jnp.ndarray, cap: float | None) -> jnp.ndarray:
  """cap * tanh(x / cap) (Gemma 2 soft-capping); x unchanged when cap is None."""
  return x if cap is None else jnp.tanh(x / cap) * cap


def grouped_attention(q, k, v, mask, scale: float, cap: float | None, kv_layout: str = "bskd"):
  """XLA grouped-query attention: q [B,T,Hq,D], k / v [B,S,Hkv,D] ("bskd") or [B,Hkv,S,D] ("bksd", the
  unrolled decoder's cache and pages gathered from a paged one), mask [B,T,S] bool -> [B,T,Hq,D];
  scores = softcap(q.k * scale, cap) in f32."""
  b, t, hq, d = q.shape
  hkv = k.shape[kv_layout.index("k")]
  q = q.reshape(b, t, hkv, hq // hkv, d)
  scores = jnp.einsum(f"btkgd,{kv_layout}->bkgts", q, k, preferred_element_type=jnp.float32) * scale
  scores = jnp.where(mask[:, None, None], softcap(scores, cap), _NEG)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum(f"bkgts,{kv_layout}->btkgd", probs, v)
  return out.reshape(b, t, hq, d)
