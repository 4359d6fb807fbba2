"""Per-token log-probs and entropies (fineflax.models.logprobs) against NumPy, dense vs chunked."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fineflax.models import logprobs as L
import pytest

pytestmark = pytest.mark.fast


def test_entropy_and_token_logp_match_numpy():
  rng = np.random.default_rng(11)
  logits = (rng.normal(size=(3, 4, 17)) * 40).astype(np.float32)  # large logits: stability
  tokens = rng.integers(0, 17, (3, 4))
  z = logits.astype(np.float64)
  lsm = z - z.max(-1, keepdims=True)
  lsm = lsm - np.log(np.exp(lsm).sum(-1, keepdims=True))
  np.testing.assert_allclose(L.token_logp(jnp.asarray(logits), jnp.asarray(tokens)),
                             np.take_along_axis(lsm, tokens[..., None], -1)[..., 0], rtol=1e-5, atol=1e-4)
  ent = np.asarray(L.entropy_from_logits(jnp.asarray(logits, jnp.bfloat16)))
  assert ent.dtype == np.float32 and np.isfinite(ent).all()
  np.testing.assert_allclose(L.entropy_from_logits(jnp.asarray(logits)), -(np.exp(lsm) * lsm).sum(-1),
                             rtol=1e-4, atol=1e-5)


def _max_intermediate_size(jaxpr) -> int:
  """Largest array (in elements) produced anywhere in a jaxpr, sub-jaxprs included."""
  best = 0
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      best = max(best, int(np.prod(getattr(v.aval, "shape", ()) or (1,))))
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (list, tuple)) else [p]):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          best = max(best, _max_intermediate_size(inner))
  return best


def test_chunked_logp_and_entropy_equal_dense_values_and_gradients():
  rng = np.random.default_rng(12)
  b, t, h, v, chunk = 3, 7, 8, 33, 3  # h < b * chunk: the kernel gradient is smaller than a chunk
  hidden = jnp.asarray(rng.normal(size=(b, t, h)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(h, v)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, v, (b, t)))
  wl, we = jnp.asarray(rng.normal(size=(b, t)), jnp.float32), jnp.asarray(rng.normal(size=(b, t)), jnp.float32)

  def dense(hd, k):
    logits = hd @ k
    return L.token_logp(logits, tokens), L.entropy_from_logits(logits)

  chunked = lambda hd, k: L.chunked_token_logp_and_entropy(hd, k, tokens, chunk=chunk)
  for got, want in zip(jax.jit(chunked)(hidden, kernel), dense(hidden, kernel)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  def obj(f):
    def scalar(hd, k):
      lp, ent = f(hd, k)
      return jnp.sum(wl * lp + we * ent)
    return scalar

  g_chunk = jax.jit(jax.grad(obj(chunked), argnums=(0, 1)))(hidden, kernel)
  g_dense = jax.jit(jax.grad(obj(dense), argnums=(0, 1)))(hidden, kernel)
  for got, want in zip(g_chunk, g_dense):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  # the backward never holds [B, T, V] logits: every intermediate is at most one chunk of logits
  jaxpr = jax.make_jaxpr(jax.grad(obj(chunked), argnums=(0, 1)))(hidden, kernel).jaxpr
  assert _max_intermediate_size(jaxpr) <= b * chunk * v < b * t * v
  assert _max_intermediate_size(jax.make_jaxpr(jax.grad(obj(dense)))(hidden, kernel).jaxpr) >= b * t * v


def test_chunked_logp_applies_the_final_logit_softcap():
  """Gemma 2: logits = c * tanh(h @ W / c); the chunked path must give the capped distribution."""
  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.normal(size=(2, 5, 8)) * 3, jnp.float32)
  w = jnp.asarray(rng.normal(size=(8, 11)) * 3, jnp.float32)
  tok = jnp.asarray(rng.integers(0, 11, (2, 5)))
  cap = 4.0
  capped = cap * np.tanh(np.asarray(h @ w) / cap)
  lsm = capped - np.log(np.exp(capped).sum(-1, keepdims=True))
  want = np.take_along_axis(lsm, np.asarray(tok)[..., None], -1)[..., 0]
  got, _ = L.chunked_token_logp_and_entropy(h, w, tok, chunk=2, logit_softcap=cap)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  plain, _ = L.chunked_token_logp_and_entropy(h, w, tok, chunk=2)
  assert np.abs(np.asarray(plain) - want).max() > 1e-2


def test_chunked_token_logp_gradient_from_forward_equals_recomputing_path():
  # chunked_token_logp keeps d logp / d h from the forward pass; values and gradients (to hidden, and to
  # the kernel through its fallback) equal chunked_token_logp_and_entropy's, with and without a soft-cap
  rng = np.random.default_rng(3)
  h = jnp.asarray(rng.normal(size=(2, 7, 8)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(8, 11)), jnp.float32)
  t = jnp.asarray(rng.integers(0, 11, (2, 7)))
  g = jnp.asarray(rng.normal(size=(2, 7)), jnp.float32)
  def both(h_, w_, cap):
    old = lambda h2, w2: jnp.sum(g * L.chunked_token_logp_and_entropy(h2, w2, t, 3, cap)[0])
    new = lambda h2, w2: jnp.sum(g * L.chunked_token_logp(h2, w2, t, 3, cap))
    return (old(h_, w_), jax.grad(old, argnums=(0, 1))(h_, w_)), (new(h_, w_), jax.grad(new)(h_, w_),
                                                                 jax.grad(new, argnums=(0, 1))(h_, w_))
  for cap in (None, 3.0):
    (v_old, (gh_old, gw_old)), (v_new, gh_new, (gh_new2, gw_new)) = jax.jit(both, static_argnums=2)(h, w, cap)
    np.testing.assert_allclose(v_new, v_old, rtol=1e-6)
    for a, b in ((gh_new, gh_old), (gh_new2, gh_old), (gw_new, gw_old)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
