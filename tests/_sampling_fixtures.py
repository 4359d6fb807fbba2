"""Shared fixtures of the sampling tests: a tiny random transformers Llama, a character tokenizer, and random
weights for configs with every numerics switch."""
from __future__ import annotations

import functools
import tempfile

import jax.numpy as jnp
import numpy as np
import torch

from fineflax.models import ModelConfig


@functools.lru_cache(maxsize=None)
def tiny_llama(tie: bool = False):
  """(transformers model, fineflax params f32, ModelConfig) of one random tiny Llama (via save_pretrained)."""
  from transformers import LlamaConfig, LlamaForCausalLM
  from fineflax.models.load import load
  torch.manual_seed(0)
  hf_config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                          initializer_range=0.1, tie_word_embeddings=tie, bos_token_id=1,
                          eos_token_id=2, pad_token_id=0)
  model = LlamaForCausalLM(hf_config).eval()
  folder = tempfile.mkdtemp(prefix="fineflax_tiny_llama_")
  model.save_pretrained(folder)
  params, config, _ = load(folder, dtype=jnp.float32, with_tokenizer=False)
  return model, params, config


def hf_greedy(model, prompts, max_new_tokens: int) -> np.ndarray:
  """transformers greedy generate on left-padded prompts: tokens [B, max_new_tokens], 0 after EOS."""
  width = max(len(p) for p in prompts)
  ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts])
  mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
  threads = torch.get_num_threads()
  torch.set_num_threads(1)  # 2 contended cores: OpenMP spinning makes small matmuls 50x slower
  try:
    with torch.no_grad():
      out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                           do_sample=False, pad_token_id=0)
  finally:
    torch.set_num_threads(threads)
  out = out[:, width:].numpy()  # rows stop at the config's EOS, then hold pad 0
  return np.pad(out, ((0, 0), (0, max_new_tokens - out.shape[1])))


class CharTokenizer:
  """Token i decodes to letter (i mod 26) repeated 1 + i // 26 times: token boundaries inside words."""
  eos_token_id = None

  def __init__(self, vocab_size: int = 96):
    self.pieces = [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(vocab_size)]

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    return "".join(self.pieces[int(i)] for i in ids)


BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16)
# every numerics switch at once: q/k/v, o and MLP biases (Qwen2 / Llama), qk-norm (Qwen3), Gemma 2 norms,
# embedding scale, soft-caps, query scale and sliding / full layers
EVERYTHING = ModelConfig(**BASE, model_type="gemma2", attention_bias=True, attention_out_bias=True,
                         mlp_bias=True, qk_norm=True, hidden_act="gelu_pytorch_tanh", norm_offset=1.0,
                         embed_scale=True, sandwich_norms=True, query_pre_attn_scalar=16.0,
                         attn_logit_softcapping=5.0, final_logit_softcapping=5.0, sliding_window=4,
                         layer_types=("sliding_attention", "full_attention"))
LLAMA = ModelConfig(**BASE, tie_word_embeddings=True)


def random_params(config, seed=0):
  """Random f32 weights in the `init_params` layout: N(0, 0.2) kernels, noisy biases and norm weights
  (so a misplaced one changes the answer). NumPy-drawn: no per-shape random-op compiles."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape, std=0.2: jnp.asarray(std * rng.standard_normal(shape), jnp.float32)
  c, n_layers = config, config.num_layers
  layers = {n: {"kernel": normal(n_layers, *shape)} for n, shape in c.linear_shapes().items()}
  for n in c.bias_names():
    layers[n]["bias"] = normal(n_layers, layers[n]["kernel"].shape[-1], std=0.1)
  for n in c.vector_names():
    width = c.head_dim if n in ("q_norm", "k_norm") else c.hidden_size
    layers[n] = 1.0 - c.norm_offset + normal(n_layers, width, std=0.1)
  params = {"embed": normal(c.vocab_size, c.hidden_size), "layers": layers,
            "final_norm": 1.0 - c.norm_offset + normal(c.hidden_size, std=0.1)}
  if not c.tie_word_embeddings:
    params["lm_head"] = {"kernel": normal(c.hidden_size, c.vocab_size)}
  return params


def nf4_greedy_case(impl: str):
  """A tiny random NF4 Llama (f32) and greedy(dense_base) -> [2, 6] tokens of two 5-token prompts decoded by
  `SamplerSession(impl=impl)`: dense_base=True decodes the dequantised weights (the reference)."""
  import jax
  from fineflax.models import init_params
  from fineflax.models.quantize import quantize_params
  from fineflax.sampling import SamplerSession
  config = ModelConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=32, tie_word_embeddings=True, max_position_embeddings=64)
  params = quantize_params(init_params(config, jax.random.key(1), jnp.float32, std=0.2), kind="nf4")
  prompts = np.random.default_rng(0).integers(0, 256, (2, 5)).tolist()

  def greedy(dense_base: bool, check=None) -> np.ndarray:
    s = SamplerSession(params, config, max_total_len=16, temperature=0.0, eos_ids=(), dtype=jnp.float32,
                       impl=impl, dense_base=dense_base)
    if check is not None:
      check(s)
    s.start(prompts)
    s.decode(6)
    return np.asarray(s.result(width=6).tokens)
  return greedy
