"""Model config without weights, and a memory estimate for `launch.py --dry_run`."""
from __future__ import annotations

import os

from fineflax.io import read_json
from fineflax.models.config import ModelConfig
from fineflax.models.hub_shapes import hub_config
from fineflax.models.load import resolve_source

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)  # codes + 8-bit absmax + fp32 second-level absmax


def load_config(source: str | os.PathLike) -> ModelConfig:
  """The ModelConfig of `source` read from config.json or GGUF metadata only (no tensor data); a hub name of
  `fineflax.models.hub_shapes.HUB_CONFIGS` that is not a local path is built from that table (no download)."""
  known = hub_config(str(source))
  if known is not None and not os.path.exists(str(source)):
    return ModelConfig.from_hf(known, source=f"{source} (fineflax.models.hub_shapes)")
  path = resolve_source(str(source))
  if path.is_dir():
    cfg = path / "config.json"
    if not cfg.exists():
      raise FileNotFoundError(f"{path}: no config.json")
    return ModelConfig.from_hf(read_json(cfg), source=str(cfg))
  from fineflax.models.gguf_import import hf_config_from_gguf, open_gguf
  return ModelConfig.from_hf(hf_config_from_gguf(open_gguf(path), str(path)), source=str(path))


def linear_params(config: ModelConfig, names=None) -> int:
  """Parameters in the seven linear projections of all layers (what QLoRA quantises); `names`: only those
  linears (e.g. ("q", "k", "v", "gate", "up"))."""
  return config.num_layers * sum(i * o for n, (i, o) in config.linear_shapes().items() if names is None or n in names)


def lora_params(config: ModelConfig, r: int, targets=("q", "k", "v", "o", "gate", "up", "down")) -> int:
  """Parameters of rank-r adapters A (in, r) and B (r, out) on each targeted linear."""
  c, dims = config, config.linear_shapes()
  return c.num_layers * sum(r * (i + o) for n, (i, o) in dims.items() if n in targets)


def memory_estimate(config: ModelConfig, *, dtype: str = "bfloat16", quant: str = "none",
                    lora_rank: int = 0, batch: int = 1, seq_len: int = 1024) -> dict[str, float]:
  """Rough GiB: frozen weights, LoRA + AdamW state (f32), KV cache / activation checkpoints."""
  gib = 1024 ** 3
  total, lin = config.num_params(), linear_params(config)
  wbytes = _BYTES[dtype]
  weights = (total - lin) * wbytes + lin * (NF4_BITS / 8 if quant == "nf4" else
                                             1 if quant == "int8" else wbytes)
  lora = lora_params(config, lora_rank) * 4 * 4 if lora_rank else 0  # param, grad, adam mu, nu
  kv = 2 * config.num_layers * batch * seq_len * config.num_kv_heads * config.head_dim * wbytes
  acts = config.num_layers * batch * seq_len * config.hidden_size * wbytes  # one checkpoint a layer
  return {"weights_gib": weights / gib, "lora_and_optimizer_gib": lora / gib,
          "kv_cache_gib": kv / gib, "activation_checkpoints_gib": acts / gib,
          "total_gib": (weights + lora + kv + acts) / gib}
