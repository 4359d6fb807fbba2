"""Shared fixtures of the sampling tests: a tiny random transformers Llama and a character tokenizer."""
from __future__ import annotations

import functools
import tempfile

import jax.numpy as jnp
import numpy as np
import torch


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
