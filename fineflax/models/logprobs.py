"""Per-token log-probabilities and entropies of a decoder's next-token distribution (f32, chunked).

Shared by the SFT loss, the RL losses and the sampler's checks: logits = hidden @ out_kernel, then
log_softmax in f32.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fineflax.models.attention import softcap
from fineflax.models.decoder import project_logits

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


def _chunks(x, n, chunk):
  """[B, T, ...] -> [n, B, chunk, ...] (T zero-padded to n * chunk)."""
  pad = n * chunk - x.shape[1]
  x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  return x.reshape(x.shape[0], n, chunk, *x.shape[2:]).swapaxes(0, 1)


def _unchunk(x, t):
  """[n, B, chunk, ...] -> [B, T, ...]."""
  x = x.swapaxes(0, 1)
  return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :t]


def _logp_and_dh(hidden, out_kernel, tokens, chunk, logit_softcap):
  """(token_logp [B, T], d token_logp / d hidden [B, T, H] f32), one T-chunk of logits at a time.

  With z = softcap(l), l = h @ W:  d logp / d l = (onehot(token) - softmax(z)) * dz/dl,
  dz/dl = 1 - (z / c)^2 for a soft-cap c (else 1), and d logp / d h = (d logp / d l) @ W^T, the logit
  gradient cast to W's dtype before the matmul (f32 accumulation), as `project_logits`' backward does.
  """
  b, t, _ = hidden.shape
  chunk = max(1, min(int(chunk), t))
  n = -(-t // chunk)

  def one_chunk(args):
    hc, tc = args
    z = softcap(project_logits(hc, out_kernel), logit_softcap)
    lse = jax.nn.logsumexp(z, axis=-1, keepdims=True)
    logp = jnp.take_along_axis(z, tc[..., None].astype(jnp.int32), axis=-1)[..., 0] - lse[..., 0]
    dz = jax.nn.one_hot(tc, z.shape[-1], dtype=jnp.float32) - jnp.exp(z - lse)
    if logit_softcap is not None:
      dz = dz * (1.0 - jnp.square(z / logit_softcap))
    # W [H, V] stays the left operand in its own layout (dh^T = W @ dz^T): with dz on the left, XLA:CPU
    # hoists a transposed [V, H] copy of W (1.1 GB for Qwen2.5-7B) out of the chunk loop
    dz2 = dz.astype(out_kernel.dtype).reshape(-1, dz.shape[-1])
    dh_t = jax.lax.dot_general(out_kernel, dz2, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    dh = dh_t.T.reshape(*dz.shape[:-1], out_kernel.shape[0])
    return logp, dh

  logp, dh = jax.lax.map(one_chunk, (_chunks(hidden, n, chunk), _chunks(tokens, n, chunk)))
  return _unchunk(logp, t), _unchunk(dh, t)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def chunked_token_logp(hidden, out_kernel, tokens, chunk: int = 128, logit_softcap=None):
  """token_logp [B, T] of logits = softcap(hidden @ out_kernel) (f32), at most [B, chunk, V] logits at once.

  The values of `chunked_token_logp_and_entropy(...)[0]`; for training. Its gradient to `hidden` is
  computed in the forward pass (`_logp_and_dh`) and kept ([B, T, H] f32), so the backward pass is
  dh = g[..., None] * d logp / d h: the [B, T, V] logits are computed once per step, not recomputed.
  When `out_kernel` itself is differentiated (a trained head), it falls back to
  `chunked_token_logp_and_entropy`'s recomputing backward.
  """
  return _logp_and_dh(hidden, out_kernel, tokens, chunk, logit_softcap)[0]


def _clp_fwd(hidden, out_kernel, tokens, chunk, logit_softcap):
  if out_kernel.perturbed:  # a trained head needs dW: the recomputing path
    f = lambda h, w: chunked_token_logp_and_entropy(h, w, tokens.value, chunk, logit_softcap)[0]
    logp, vjp = jax.vjp(f, hidden.value, out_kernel.value)
    return logp, (vjp,)
  logp, dh = _logp_and_dh(hidden.value, out_kernel.value, tokens.value, chunk, logit_softcap)
  return logp, (dh, jnp.zeros((0,), hidden.value.dtype))


def _clp_bwd(chunk, logit_softcap, res, g):
  if len(res) == 1:  # the recomputing path (a trained head)
    dh, dw = res[0](g)
    return dh, dw, None
  dh_unit, h_proto = res
  return (g[..., None] * dh_unit).astype(h_proto.dtype), None, None  # None: zero cotangents


chunked_token_logp.defvjp(_clp_fwd, _clp_bwd, symbolic_zeros=True)


def _nll_and_grads(hidden, out_kernel, tokens, weights, chunk, logit_softcap, want_dw: bool):
  """(sum_t w_t · -logp_t, d/dh [B, T, H] f32, d/dW [H, V] in W's dtype or None), one T-chunk of logits at a time.

  With z = softcap(h @ W): d(-logp_t)/dz = (softmax(z) - onehot(token)) · dz/dl (`_logp_and_dh`), weighted by
  w_t; dh = dz @ W^T and dW = sum over chunks of h^T @ dz (f32 accumulation), dz cast to W's dtype before both
  matmuls as `project_logits`' backward does. Three head matmuls a chunk, all in this one pass."""
  b, t, _ = hidden.shape
  chunk = max(1, min(int(chunk), t))
  n = -(-t // chunk)

  def one_chunk(dw, args):
    hc, tc, wc = args
    z = softcap(project_logits(hc, out_kernel), logit_softcap)
    lse = jax.nn.logsumexp(z, axis=-1, keepdims=True)
    logp = jnp.take_along_axis(z, tc[..., None].astype(jnp.int32), axis=-1)[..., 0] - lse[..., 0]
    dz = (jnp.exp(z - lse) - jax.nn.one_hot(tc, z.shape[-1], dtype=jnp.float32)) * wc[..., None]
    if logit_softcap is not None:
      dz = dz * (1.0 - jnp.square(z / logit_softcap))
    dz2 = dz.astype(out_kernel.dtype).reshape(-1, dz.shape[-1])
    dh_t = jax.lax.dot_general(out_kernel, dz2, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    dh = dh_t.T.reshape(*dz.shape[:-1], out_kernel.shape[0])
    if dw is not None:
      h2 = hc.astype(out_kernel.dtype).reshape(-1, hc.shape[-1])
      dw = dw + jax.lax.dot_general(h2, dz2, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return dw, (-jnp.sum(wc * logp), dh)

  dw0 = jnp.zeros(out_kernel.shape, jnp.float32) if want_dw else None
  xs = (_chunks(hidden, n, chunk), _chunks(tokens, n, chunk), _chunks(weights.astype(jnp.float32), n, chunk))
  dw, (nll, dh) = jax.lax.scan(one_chunk, dw0, xs)
  return jnp.sum(nll), _unchunk(dh, t), None if dw is None else dw.astype(out_kernel.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def fused_weighted_nll(hidden, out_kernel, tokens, weights, chunk: int = 128, logit_softcap=None):
  """sum_t weights_t · -log softmax(softcap(hidden @ out_kernel))[tokens_t] (f32), a fused linear cross-entropy:
  the gradients to `hidden` and (when it is differentiated: a trained head) to `out_kernel` are computed in the
  forward pass, chunk by chunk (`_nll_and_grads`), and scaled by the incoming cotangent in the backward pass.
  The [B, T, V] logits are made once and never stored (at most [B, chunk, V] live): three head matmuls a step
  instead of `chunked_token_logp`'s four for a trained head (its backward recomputes the logits). Same values
  as -sum(weights · chunked_token_logp(...)); `weights` get no gradient (a loss mask)."""
  return _nll_and_grads(hidden, out_kernel, tokens, weights, chunk, logit_softcap, False)[0]


def _fwn_fwd(hidden, out_kernel, tokens, weights, chunk, logit_softcap):
  nll, dh, dw = _nll_and_grads(hidden.value, out_kernel.value, tokens.value, weights.value, chunk, logit_softcap,
                               out_kernel.perturbed)
  return nll, (dh, dw, jnp.zeros((0,), hidden.value.dtype))


def _fwn_bwd(chunk, logit_softcap, res, g):
  dh, dw, h_proto = res
  return ((g * dh).astype(h_proto.dtype), None if dw is None else (g * dw.astype(jnp.float32)).astype(dw.dtype),
          None, None)


fused_weighted_nll.defvjp(_fwn_fwd, _fwn_bwd, symbolic_zeros=True)
