"""Every config field that changes the math, and the Gemma 2 / Gemma 3 / Phi-3 families: logits parity
with transformers (tiny random models, plain and left-padded rows, <= 1e-4 relative), and each feature
really matters (turning it off in the fineflax config breaks the parity)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from fineflax.testing.hf_models import make_hf_model
from fineflax.models import ModelConfig, forward, load

ROPE = {"rope_theta": 10000.0}
# case -> (family, transformers overrides, sequence length, fineflax config change that must break parity,
# or the linears whose biases are dropped to break it)
CASES = {
    "mistral_sliding_window": ("mistral", dict(sliding_window=16), 40, dict(sliding_window=None)),
    "qwen2_use_sliding_window": ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1),
                                 24, dict(sliding_window=None)),
    "llama_attention_bias": ("llama", dict(attention_bias=True), 24, ("o",)),
    "qwen3_attention_bias": ("qwen3", dict(attention_bias=True), 24, ("o",)),
    "llama_mlp_bias": ("llama", dict(mlp_bias=True), 24, ("gate", "up", "down")),
    "llama_gelu": ("llama", dict(hidden_act="gelu"), 24, dict(hidden_act="silu")),
    "llama_relu": ("llama", dict(hidden_act="relu"), 24, dict(hidden_act="silu")),
    "llama_yarn": ("llama", dict(max_position_embeddings=64, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, **ROPE}), 40,
        dict(rope_scaling=None)),
    "llama_dynamic_ntk": ("llama", dict(max_position_embeddings=16, rope_parameters={
        "rope_type": "dynamic", "factor": 2.0, **ROPE}), 40, dict(rope_scaling=None)),
    "gemma2": ("gemma2", {}, 24, dict(sliding_window=None)),  # (Gemma: gelu_pytorch_tanh)
    "gemma2_softcaps": ("gemma2", dict(attn_logit_softcapping=0.5, final_logit_softcapping=0.3, initializer_range=0.2), 24,
                        dict(attn_logit_softcapping=None)),
    "gemma3": ("gemma3", {}, 24, dict(local_rope_theta=None)),
    "gemma3_linear_rope": ("gemma3", dict(rope_scaling={"rope_type": "linear", "factor": 8.0}), 24,
                           dict(rope_scaling=None)),
    "phi3": ("phi3", {}, 24, dict(hidden_act="gelu")),
    "phi3_sliding_window": ("phi3", dict(sliding_window=8), 24, dict(sliding_window=None)),
}


def _max_rel_err(out, ref, mask):
  return max(float(np.abs(out[b, m] - ref[b, m]).max() / np.abs(ref[b, m]).max())
             for b, m in enumerate(mask.astype(bool)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case, tmp_path):
  family, overrides, length, knockout = CASES[case]
  model = make_hf_model(family, tmp_path, **overrides)
  params, config, _ = load(tmp_path, with_tokenizer=False)
  assert ModelConfig.from_hf(config.to_hf()) == config  # export_merged writes config.to_hf()
  tokens = np.random.RandomState(1).randint(0, config.vocab_size, (3, length))
  mask = np.ones_like(tokens)
  mask[1, :5] = 0  # left padding
  mask[2, :11] = 0
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)  # as transformers' generate (dynamic rope reads them)
  with torch.no_grad():
    ref = model(torch.tensor(tokens), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions)).logits.numpy()
  fwd = jax.jit(forward, static_argnums=1)
  out = np.asarray(fwd(params, config, jnp.asarray(tokens), attention_mask=jnp.asarray(mask)))
  assert _max_rel_err(out, ref, mask) <= 1e-4
  if isinstance(knockout, dict):
    config = dataclasses.replace(config, **knockout)
  else:
    layers = {**params["layers"], **{n: {"kernel": params["layers"][n]["kernel"]} for n in knockout}}
    params = {**params, "layers": layers}
  broken = np.asarray(fwd(params, config, jnp.asarray(tokens), attention_mask=jnp.asarray(mask)))
  assert _max_rel_err(broken, ref, mask) > 1e-3, f"{knockout} does not change the logits: weak test"


@pytest.mark.parametrize("family", ["gemma3", "phi3"])  # Gemma 2: test_lora_peft's NF4 merged export
def test_nf4_forward_of_new_families(family, tmp_path):
  from fineflax.quant import dequantize_params, is_quantized
  from fineflax.models.quantize import quantize_params
  make_hf_model(family, tmp_path)
  params, config, _ = load(tmp_path, with_tokenizer=False)
  q = quantize_params(params)
  assert all(is_quantized(q["layers"][n]["kernel"]) for n in ("q", "k", "v", "o", "gate", "up", "down"))
  tokens = jnp.asarray(np.random.RandomState(3).randint(0, config.vocab_size, (2, 16)))
  fwd = jax.jit(forward, static_argnums=1)
  exact, nf4 = np.asarray(fwd(params, config, tokens)), np.asarray(fwd(q, config, tokens))
  np.testing.assert_allclose(nf4, np.asarray(fwd(dequantize_params(q), config, tokens)), atol=1e-5, rtol=0)
  for n in ("q", "gate"):  # NF4 itself: ~10% relative error on Gaussian weights
    w, wq = np.asarray(params["layers"][n]["kernel"]), np.asarray(q["layers"][n]["kernel"].dequantize())
    assert np.linalg.norm(wq - w) / np.linalg.norm(w) < 0.12
  rel = np.linalg.norm(nf4 - exact) / np.linalg.norm(exact)
  assert 0 < rel < 0.5, rel  # tiny random models amplify it: 10-31% on the logits


def test_raw_output_kernel_refuses_soft_capped_models():
  from fineflax.models import ModelConfig, init_params, output_kernel
  config = ModelConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2,
                       num_kv_heads=1, head_dim=4, final_logit_softcapping=30.0)
  params = init_params(config, jax.random.key(0))
  with pytest.raises(ValueError, match=r"final_logit_softcapping=30.0: raw h @ output_kernel"):
    output_kernel(params, config, jnp.float32)  # chunked log-prob paths would silently drop the cap
  assert output_kernel(params, config, jnp.float32, softcap_applied=True).shape == (8, 16)
