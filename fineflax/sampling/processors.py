"""Logit processing and token sampling: temperature, top-k, top-p (nucleus), as transformers' warpers.

For f32 logits z [B, V] and a `SamplingConfig` (temperature T, top_k k, top_p p):

  z' = z / T                                   (T = 0: greedy, argmax of z)
  z' = -inf where z' < (k-th largest z')       (k > 0; ties with the k-th value are kept)
  z' = -inf where the probability mass of the tokens strictly more likely (sorted descending)
        is >= p                                (p < 1; the most likely token is always kept)
  y ~ Categorical(softmax(z'))
  logprob     = log_softmax(z')[y]   (sampling distribution; 0 under greedy, a point mass)
  raw_logprob = log_softmax(z)[y]    (the untempered model)
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """Static sampling settings (hashable: part of the jit cache key)."""
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature={self.temperature}: must be >= 0 (0 = greedy)")
    if self.top_k < 0:
      raise ValueError(f"top_k={self.top_k}: must be >= 0 (0 = off)")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p={self.top_p}: must be in (0, 1] (1 = off)")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0


def process_logits(logits: jnp.ndarray, sc: SamplingConfig) -> jnp.ndarray:
  """The sampling distribution's logits z' (see module docstring); f32 [..., V]. Greedy: z unchanged."""
  z = logits.astype(jnp.float32)
  if sc.greedy:
    return z
  if sc.temperature != 1.0:
    z = z / sc.temperature
  if 0 < sc.top_k < z.shape[-1]:
    kth = jax.lax.top_k(z, sc.top_k)[0][..., -1:]
    z = jnp.where(z < kth, -jnp.inf, z)
  if sc.top_p < 1.0:
    sorted_z = jnp.sort(z, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(sorted_z, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = mass_before < sc.top_p
    threshold = jnp.min(jnp.where(keep, sorted_z, jnp.inf), axis=-1, keepdims=True)
    z = jnp.where(z < threshold, -jnp.inf, z)
  return z


def sample_tokens(logits: jnp.ndarray, rng: jax.Array, sc: SamplingConfig):
  """(tokens int32 [B], logprob f32 [B], raw_logprob f32 [B]) from f32 logits [B, V]."""
  logits = logits.astype(jnp.float32)
  raw_logp = jax.nn.log_softmax(logits, axis=-1)
  if sc.greedy:
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logprob = jnp.zeros(tokens.shape, jnp.float32)
  else:
    z = process_logits(logits, sc)
    tokens = jax.random.categorical(rng, z, axis=-1).astype(jnp.int32)
    logprob = jnp.take_along_axis(jax.nn.log_softmax(z, axis=-1), tokens[:, None], axis=-1)[:, 0]
  raw = jnp.take_along_axis(raw_logp, tokens[:, None], axis=-1)[:, 0]
  return tokens, logprob, raw
