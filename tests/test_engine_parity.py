"""The engine-backed SamplerSession (paged KV cache) against the static-cache sampler it replaces, in f32,
for every model family: greedy tokens, masks and finish reasons equal and log-probs equal to f32 rounding
over the whole session protocol (LoRA adapters, a stop string cutting rows mid-chunk, tool output
appended to some rows, decoding on; a repeated prompt sharing its pages)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _sampling_fixtures import CharTokenizer
from fineflax.testing.hf_models import make_hf_model
from fineflax import lora as L
from fineflax.models import load
from fineflax.sampling import SamplerSession

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [30, 31], [5, 6, 7, 8, 9]]
FAMILIES = {  # windows of 6-8 tokens: the sessions run past them
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "mistral_sliding_window": ("mistral", dict(sliding_window=8)),
    "gemma2": ("gemma2", dict(final_logit_softcapping=5.0, attn_logit_softcapping=5.0)),
    "gemma3": ("gemma3", {}),
    "phi3": ("phi3", {}),
}


def _session(params, config, lora, cache, stop):
  s = SamplerSession(params, config, max_total_len=32, temperature=0.0, eos_ids=(), dtype=jnp.float32,
                     lora=lora, lora_scale=2.0, tokenizer=CharTokenizer(config.vocab_size), chunk_size=4,
                     cache=cache)
  s.start(PROMPTS)
  s.decode(9, stop_strings=(stop,) if stop else ())
  s.append({0: [40, 41], 2: [50], 3: [60, 61, 62]})
  s.decode(7)
  return s


@pytest.mark.long
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_paged_session_equals_static_session(family, tmp_path):
  name, overrides = FAMILIES[family]
  make_hf_model(name, tmp_path, initializer_range=0.2, **overrides)
  params, config, _ = load(tmp_path, with_tokenizer=False)
  lora = L.init_lora(params, config, L.LoraConfig(r=4, alpha=8.0), jax.random.PRNGKey(0))
  lora = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(1), x.shape), lora)
  first = _session(params, config, lora, "paged", None).result()  # (its programs serve the next run)
  stop = CharTokenizer(config.vocab_size).decode(first.tokens[1, 3:5])  # cuts row 1 (and maybe others)
  paged = _session(params, config, lora, "paged", stop)
  static = _session(params, config, lora, "static", stop)
  a, b = static.result(), paged.result()
  assert "stop" in a.finish_reason[:2] and a.finish_reason == b.finish_reason
  np.testing.assert_array_equal(b.tokens, a.tokens)
  np.testing.assert_array_equal(b.mask, a.mask)
  np.testing.assert_array_equal(b.valid, a.valid)
  assert b.texts == a.texts
  np.testing.assert_allclose(b.raw_logprobs, a.raw_logprobs, atol=2e-5)
  assert len({tuple(r) for r in a.tokens[:3].tolist()}) == 3  # distinct continuations
  assert paged.engine.stats["prefill_tokens"] < sum(len(p) - 1 for p in PROMPTS) + 2 + 1 + 3  # 3 shares 0's
  paged.engine.pages.check()
