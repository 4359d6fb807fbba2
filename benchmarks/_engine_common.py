"""What benchmarks/engine.py's case workers share: the model shapes by name, their `ModelConfig`, random bf16
weights with the bytes and bandwidth the bounds need, random prompts, case b's response lengths, and an `Engine`
of a case's rows.

jax is imported inside the functions: each case imports it in its own process.
"""
from __future__ import annotations

from benchmarks import gpu
from benchmarks.sampler import SHAPES as SAMPLER_SHAPES

LLAMA3_ROPE = (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
               ("original_max_position_embeddings", 8192), ("rope_type", "llama3"))
SHAPES = {
    "Llama-3.1-8B": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                         num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                         tie_word_embeddings=False, rope_scaling=LLAMA3_ROPE),
    "Llama-3.2-1B": SAMPLER_SHAPES["Llama-3.2-1B"],
    "Llama-3.1-70B": "meta-llama/Llama-3.1-70B",  # fineflax.models.hub_shapes
    "Qwen2.5-1.5B": "Qwen/Qwen2.5-1.5B",  # the GRPO-vs-tunix shape (benchmarks/tunix_grpo.py)
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=16, tie_word_embeddings=True),
    "tiny_tp": dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,  # NF4 column
                    num_kv_heads=2, head_dim=64, tie_word_embeddings=True),  # blocks: out / 2 a multiple of 64;
    # every linear's shard fits the fused NF4 kernel (K a multiple of 128, row shards whole nested scale groups)
}


def _config(shape: dict | str):
  from fineflax.models import ModelConfig
  if isinstance(shape, str):  # a hub name: its config.json fields from fineflax.models.hub_shapes
    from fineflax.models.estimate import load_config
    return load_config(shape)
  shape = dict(shape)
  if shape.get("rope_scaling"):  # JSON made the tuples lists; the config must stay hashable
    shape["rope_scaling"] = tuple(tuple(kv) for kv in shape["rope_scaling"])
  return ModelConfig(**shape, max_position_embeddings=131072)


def _setup(spec: dict):
  """(config, bf16 random params, weight bytes, kv bytes per token, copy bandwidth B/s)."""
  import jax
  import jax.numpy as jnp
  from benchmarks._random_weights import random_params
  config = _config(SHAPES[spec["shape"]])
  bw = gpu.jax_copy_bandwidth(spec["copy_bytes"])
  params = random_params(config, "none", jax.random.key(0), jnp.bfloat16)
  weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  kv_bytes = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 2
  return config, params, weight_bytes, kv_bytes, bw


def _prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
  import numpy as np
  return np.random.default_rng(seed).integers(3, vocab, (n, length)).tolist()


def response_lengths(rows: int, median: int, cap: int, sigma: float, seed: int = 0) -> list[int]:
  """min(cap, max(1, round(exp(N(ln median, sigma^2))))) per row."""
  import numpy as np
  draws = np.exp(np.random.default_rng(seed).normal(np.log(median), sigma, rows))
  return np.clip(np.round(draws), 1, cap).astype(int).tolist()


def _engine(params, config, spec, *, max_rows, lengths, attention, prepared, num_pages=0, **kw):
  """An engine of these rows; num_pages 0: a pool holding every row's whole length (`engine_pool_pages`)."""
  import jax.numpy as jnp
  from fineflax.engine import Engine
  from fineflax.sampling.session import engine_pool_pages
  return Engine(params, config, max_rows=max_rows, num_pages=num_pages or engine_pool_pages(lengths, spec["page_size"]),
                page_size=spec["page_size"], chunk_size=spec["chunk_size"], eos_ids=(), dtype=jnp.bfloat16,
                attention=attention, prepared=prepared, impl=spec.get("impl", "auto"), **kw)
