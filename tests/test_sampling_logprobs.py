"""Sampling math: processed logits vs transformers' warpers, sample frequencies, cached logprobs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from _sampling_fixtures import tiny_llama
from fineflax.models import forward
from fineflax.sampling import SamplingConfig, generate, process_logits, sample_tokens

CONFIGS = [SamplingConfig(0.7, 0, 1.0), SamplingConfig(1.0, 5, 1.0), SamplingConfig(1.0, 0, 0.8),
           SamplingConfig(0.5, 10, 0.9), SamplingConfig(1.3, 3, 0.5)]


def hf_processed(logits: np.ndarray, sc: SamplingConfig) -> np.ndarray:
  """transformers' temperature -> top-k -> top-p warpers (the order `generate` applies them)."""
  scores = torch.tensor(np.asarray(logits, np.float32))
  warpers = [TemperatureLogitsWarper(sc.temperature)]
  if sc.top_k:
    warpers.append(TopKLogitsWarper(sc.top_k))
  if sc.top_p < 1.0:
    warpers.append(TopPLogitsWarper(sc.top_p))
  for w in warpers:
    scores = w(None, scores)
  return scores.numpy()


def log_softmax(x: np.ndarray) -> np.ndarray:
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def padded_logits(params, config, seqs, dtype) -> list[np.ndarray]:
  """Full-recompute (no cache) f32 logits [len(seq), V] per sequence, from one left-padded forward."""
  width = max(len(s) for s in seqs)
  tokens = np.array([[0] * (width - len(s)) + s for s in seqs])
  mask = np.array([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
  fwd = jax.jit(lambda p, t, m: forward(p, config, t, attention_mask=m, dtype=dtype))
  logits = np.asarray(fwd(params, jnp.asarray(tokens), jnp.asarray(mask)))
  return [logits[b, width - len(s):] for b, s in enumerate(seqs)]


@pytest.mark.parametrize("sc", CONFIGS, ids=str)
def test_process_logits_matches_transformers_warpers(sc):
  logits = 3.0 * np.random.default_rng(0).standard_normal((6, 50)).astype(np.float32)
  ours, ref = np.asarray(process_logits(jnp.asarray(logits), sc)), hf_processed(logits, sc)
  np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(ref))
  np.testing.assert_allclose(ours[np.isfinite(ref)], ref[np.isfinite(ref)], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sc", CONFIGS[1:3] + CONFIGS[4:], ids=str)
def test_sample_frequencies_follow_the_processed_distribution(sc):
  n = 8192
  logits = np.tile(np.linspace(2.0, -2.0, 12, dtype=np.float32), (n, 1))
  tokens, logprob, raw = sample_tokens(jnp.asarray(logits), jax.random.key(1), sc)
  tokens, logprob, raw = map(np.asarray, (tokens, logprob, raw))
  ref_logp = log_softmax(hf_processed(logits[:1], sc))[0]
  freq = np.bincount(tokens, minlength=12) / n
  assert not freq[~np.isfinite(ref_logp)].any(), "a token outside the top-k / top-p support was sampled"
  np.testing.assert_allclose(freq, np.exp(ref_logp), atol=0.025)  # > 5 sigma at n = 8192
  np.testing.assert_allclose(logprob, ref_logp[tokens], atol=1e-5)
  np.testing.assert_allclose(raw, log_softmax(logits[:1])[0][tokens], atol=1e-5)


def test_greedy_logprob_is_zero_and_raw_is_log_softmax():
  logits = np.random.default_rng(2).standard_normal((4, 30)).astype(np.float32)
  tokens, logprob, raw = map(np.asarray, sample_tokens(jnp.asarray(logits), None, SamplingConfig(0.0)))
  np.testing.assert_array_equal(tokens, logits.argmax(-1))
  np.testing.assert_array_equal(logprob, 0.0)
  np.testing.assert_allclose(raw, log_softmax(logits)[np.arange(4), tokens], atol=1e-6)


@pytest.mark.parametrize("dtype, atol", [(jnp.float32, 2e-4), (jnp.bfloat16, 0.1)], ids=["f32", "bf16"])
def test_cached_decode_logprobs_match_full_recompute(dtype, atol):
  _, params, config = tiny_llama()
  prompts = [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [30, 31]]
  sc = SamplingConfig(0.8, 20, 0.9)
  out = generate(params, config, prompts, max_new_tokens=16, temperature=sc.temperature, top_k=sc.top_k,
                 top_p=sc.top_p, eos_ids=(), rng=jax.random.key(3), dtype=dtype)
  assert out.mask.all()
  seqs = [p + out.tokens[b].tolist() for b, p in enumerate(prompts)]
  all_logits = padded_logits(params, config, seqs, dtype)
  for b, p in enumerate(prompts):
    logits, toks = all_logits[b][len(p) - 1:-1], out.tokens[b]
    np.testing.assert_allclose(out.raw_logprobs[b], log_softmax(logits)[np.arange(16), toks], atol=atol)
    processed = log_softmax(hf_processed(logits, sc))[np.arange(16), toks]
    if dtype == jnp.float32:  # bf16 logits may move a token across the top-k / top-p border
      assert np.isfinite(processed).all(), "sampled a token outside the top-k / top-p support"
      np.testing.assert_allclose(out.logprobs[b], processed, atol=atol)
