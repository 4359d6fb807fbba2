"""Per-token log-probabilities and entropies of a decoder's next-token distribution (f32, chunked).

Shared by the SFT loss, the RL losses and the sampler's checks: logits = hidden @ out_kernel, then
log_softmax in f32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fineflax.models.decoder import project_logits, softcap

def token_logp(logits, tokens):
  """log pi(token) = log_softmax(logits)[token], in f32. logits [..., V], tokens [...] -> [...]."""
  lsm = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(lsm, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy_from_logits(logits):
  """H = -sum_v p_v log p_v with log p = log_softmax(logits) (f32, stable). [..., V] -> [...]."""
  lsm = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)


def chunked_token_logp_and_entropy(hidden, out_kernel, tokens, chunk: int = 128, logit_softcap=None):
  """(token_logp [B, T], entropy [B, T]) of logits = hidden @ out_kernel, one T-chunk at a time.

  hidden [B, T, H], out_kernel [H, V], tokens [B, T]. Equals `token_logp` / `entropy_from_logits` of
  the dense f32 logits, but at most [B, chunk, V] logits live at once: the chunks run under
  `lax.map` with a `jax.checkpoint`ed body, so the backward pass recomputes each chunk's logits
  instead of storing them. T is padded up to a multiple of `chunk` (padding is dropped).
  logit_softcap: the model's final-logit soft-cap c (Gemma 2): logits = c · tanh(h @ W / c).
  """
  b, t, h = hidden.shape
  chunk = max(1, min(int(chunk), t))
  n = -(-t // chunk)
  pad = n * chunk - t
  hs = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, h).swapaxes(0, 1)
  ts = jnp.pad(tokens, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)

  @jax.checkpoint
  def one_chunk(args):
    hc, tc = args
    logits = softcap(project_logits(hc, out_kernel.astype(hc.dtype)), logit_softcap)
    return token_logp(logits, tc), entropy_from_logits(logits)

  logp, ent = jax.lax.map(one_chunk, (hs, ts))
  unchunk = lambda x: x.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
  return unchunk(logp), unchunk(ent)
