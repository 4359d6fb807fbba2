"""Tiny random Hugging Face checkpoints written by transformers (torch), for parity tests and benchmarks."""
from __future__ import annotations


TINY = dict(vocab_size=160, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


GEMMA = dict(head_dim=16, query_pre_attn_scalar=24, pad_token_id=0, bos_token_id=2, eos_token_id=1)


def make_hf_model(family: str, path, seed: int = 0, **overrides):
  """Writes a tiny random transformers model of `family` to `path`; returns the torch model (f32, eval).

  family: llama, llama3, smollm2, mistral, qwen2, qwen3, gemma2, gemma3 (text), phi3; `overrides` go
  to the transformers config (e.g. sliding_window=8, attention_bias=True, hidden_act="gelu").
  """
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
    cfg = transformers.MistralConfig(**{"sliding_window": None, **kw})
  elif family == "qwen2":
    cfg = transformers.Qwen2Config(**kw)
  elif family == "qwen3":
    cfg = transformers.Qwen3Config(**{"head_dim": 16, **kw})
  elif family == "gemma2":
    cfg = transformers.Gemma2Config(**{**GEMMA, "sliding_window": 6, **kw})
  elif family == "gemma3":  # sliding/global pattern 2 so that both kinds occur in 2 layers
    cfg = transformers.Gemma3TextConfig(**{**GEMMA, "sliding_window": 6, "sliding_window_pattern": 2,
                                           "rope_theta": 1000.0, "rope_local_base_freq": 100.0, **kw})
  elif family == "phi3":
    cfg = transformers.Phi3Config(**{"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, **kw})
  else:
    raise ValueError(family)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
  with torch.no_grad():  # random norms and biases, so that their import is exercised
    for name, p in model.named_parameters():
      if p.ndim == 1:
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(path)
  return model
