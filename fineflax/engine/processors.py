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


@dataclasses.dataclass(frozen=True)
class RowFilters:
  """Static: what the rows of a batch need (their settings themselves are arrays): `sample` (some row has
  temperature > 0: else nothing is drawn) and `truncate` (some sampled row has top_k > 0 or top_p < 1:
  else nothing is sorted). Two flags, so a batch's mix of settings picks one of three programs."""
  sample: bool = True
  truncate: bool = False

  @classmethod
  def of(cls, temperature, top_k, top_p) -> "RowFilters":
    """The filters a batch with these per-row settings (NumPy arrays or lists) needs."""
    sampled = [(k, p) for t, k, p in zip(temperature, top_k, top_p) if t > 0]
    return cls(bool(sampled), any(k > 0 or p < 1.0 for k, p in sampled))


def process_logits(logits: jnp.ndarray, sc: SamplingConfig) -> jnp.ndarray:
  """The sampling distribution's logits z' (see module docstring); f32 [..., V]. Greedy: z unchanged."""
  z = logits.astype(jnp.float32)
  if sc.greedy:
    return z
  full = lambda v: jnp.full(z.shape[:-1], v)
  return process_logits_rows(z, full(sc.temperature), full(sc.top_k), full(sc.top_p),
                             RowFilters(True, sc.top_k > 0 or sc.top_p < 1.0))


def process_logits_rows(logits: jnp.ndarray, temperature, top_k, top_p, filters: RowFilters) -> jnp.ndarray:
  """z' of the module docstring with per-row settings: temperature, top_k, top_p [...] for logits [..., V]
  (rows with temperature 0 are divided by 1: the caller takes their argmax). One descending sort serves
  top-k (the k-th largest value) and top-p (the sorted values below it set to -inf first, as top-k leaves
  them), so each row gets exactly what `process_logits` gives with its settings."""
  z = logits.astype(jnp.float32)
  z = z / jnp.where(temperature > 0, temperature, 1.0).astype(jnp.float32)[..., None]
  if not filters.truncate:
    return z
  sorted_z = jnp.sort(z, axis=-1)[..., ::-1]
  k = jnp.asarray(top_k, jnp.int32)[..., None]
  kth = jnp.take_along_axis(sorted_z, jnp.clip(k - 1, 0, z.shape[-1] - 1), axis=-1)
  z = jnp.where((k > 0) & (z < kth), -jnp.inf, z)
  sorted_z = jnp.where((k > 0) & (sorted_z < kth), -jnp.inf, sorted_z)
  p = jnp.asarray(top_p, jnp.float32)[..., None]
  probs = jax.nn.softmax(sorted_z, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  threshold = jnp.min(jnp.where(mass_before < p, sorted_z, jnp.inf), axis=-1, keepdims=True)
  return jnp.where((p < 1.0) & (z < threshold), -jnp.inf, z)


def sample_rows(logits: jnp.ndarray, keys: jax.Array, temperature, top_k, top_p, filters: RowFilters):
  """(tokens int32 [B], logprob f32 [B], raw_logprob f32 [B]) from f32 logits [B, V] with per-row settings
  [B] and per-row keys [B] (typed PRNG keys); rows with temperature 0 take the argmax (logprob 0)."""
  logits = logits.astype(jnp.float32)
  raw_logp = jax.nn.log_softmax(logits, axis=-1)
  tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logprob = jnp.zeros(tokens.shape, jnp.float32)
  if filters.sample:
    z = process_logits_rows(logits, temperature, top_k, top_p, filters)
    drawn = jax.vmap(lambda key, zb: jax.random.categorical(key, zb))(keys, z).astype(jnp.int32)
    sampled = temperature > 0
    tokens = jnp.where(sampled, drawn, tokens)
    lp = jnp.take_along_axis(jax.nn.log_softmax(z, axis=-1), tokens[:, None], axis=-1)[:, 0]
    logprob = jnp.where(sampled, lp, 0.0)
  raw = jnp.take_along_axis(raw_logp, tokens[:, None], axis=-1)[:, 0]
  return tokens, logprob, raw


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
