"""Greedy decoding through the KV cache is token-identical to transformers' greedy `generate` for the
sliding-window configs (decodes longer than the window), the Gemma 2 / Gemma 3 / Phi-3 families and dynamic
NTK rope (decodes past max_position_embeddings)."""
import jax.numpy as jnp
import numpy as np
import pytest

from _sampling_fixtures import hf_greedy
from fineflax.testing.hf_models import make_hf_model
from fineflax.models import load
from fineflax.sampling import generate

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [30, 31]]
CASES = {  # family, overrides (window 6-8, prompts up to 11 tokens, 24 new tokens)
    "mistral_sliding_window": ("mistral", dict(sliding_window=8)),
    "qwen2_sliding_window": ("qwen2", dict(use_sliding_window=True, sliding_window=7, max_window_layers=0)),
    "gemma2": ("gemma2", dict(final_logit_softcapping=5.0, attn_logit_softcapping=5.0)),
    "gemma3": ("gemma3", {}),
    "phi3": ("phi3", dict(sliding_window=8)),
    # dynamic NTK: frequencies grow with the longest position of each call, as transformers' cache does
    "llama_dynamic_ntk": ("llama", dict(max_position_embeddings=16, rope_parameters={
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_matches_transformers(case, tmp_path):
  family, overrides = CASES[case]
  model = make_hf_model(family, tmp_path, initializer_range=0.2, **overrides)
  params, config, _ = load(tmp_path, with_tokenizer=False)
  if config.sliding_window is None:  # dynamic NTK: the decode runs past max_position_embeddings
    assert dict(config.rope_scaling)["rope_type"] == "dynamic" and config.max_position_embeddings < 24
  else:
    assert config.sliding_window < 24
  out = generate(params, config, PROMPTS, max_new_tokens=24, temperature=0.0, dtype=jnp.float32, eos_ids=())
  np.testing.assert_array_equal(out.tokens, hf_greedy(model, PROMPTS, 24))
