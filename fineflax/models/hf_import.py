"""Hugging Face (transformers) state-dict names and layouts <-> the stacked fineflax params pytree."""
from __future__ import annotations

import pathlib
from typing import Mapping

import numpy as np

from fineflax.io import read_json
from fineflax.models.config import ModelConfig
from fineflax.models.safetensors_io import read_checkpoint

# fineflax linear name -> HF module path inside a decoder layer.
HF_LINEARS = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
              "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
              "down": "mlp.down_proj"}
HF_VECTORS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
              "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}
GEMMA_VECTORS = {"attn_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
                 "mlp_norm": "pre_feedforward_layernorm", "post_mlp_norm": "post_feedforward_layernorm",
                 "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}
# Phi-3 fuses linears: HF module -> the fineflax linears stacked along its output rows, in order
FUSED = {"phi3": {"self_attn.qkv_proj": ("q", "k", "v"), "mlp.gate_up_proj": ("gate", "up")}}
# checkpoint tensors that carry no weights transformers uses (buffers saved by old versions)
UNUSED = ("rotary_emb.inv_freq", "masked_bias", "attn.bias")


def vector_modules(config: ModelConfig) -> dict[str, str]:
  """fineflax norm name -> HF module path inside a decoder layer, for this family."""
  table = GEMMA_VECTORS if config.sandwich_norms else HF_VECTORS
  return {n: table[n] for n in config.vector_names()}


def _fused_groups(config: ModelConfig) -> dict[str, tuple[str, ...]]:
  return FUSED.get(config.model_type, {})


def _row_splits(config: ModelConfig, names: tuple[str, ...]) -> list[int]:
  shapes = config.linear_shapes()
  return list(np.cumsum([shapes[n][1] for n in names])[:-1])


def params_from_state_dict(sd: Mapping[str, np.ndarray], config: ModelConfig,
                           dtype=None, source: str = "checkpoint") -> dict:
  """Stacks per-layer HF tensors into the fineflax pytree (NumPy). Linear weights (out, in) -> (in, out);
  fused Phi-3 linears are split by output rows (qkv -> q, k, v; gate_up -> gate, up).

  Missing tensors raise an error naming them, and so do tensors the import did not consume (apart from
  the known-unused buffers in `UNUSED`, and `lm_head.weight` when embeddings are tied, which transformers
  ignores). `dtype` (a NumPy dtype) casts every array.
  """
  sd = {k.removeprefix("model.") if k.startswith("model.") else k: v for k, v in sd.items()}
  used: set[str] = set()
  cast = (lambda a: np.asarray(a, dtype=dtype)) if dtype is not None else np.asarray
  def get(name):
    if name not in sd:
      raise KeyError(f"{source}: tensor {name!r} not found (have e.g. {sorted(sd)[:6]})")
    used.add(name)
    return cast(sd[name])
  L = config.num_layers
  stack = lambda fmt, t=False: np.stack([get(fmt.format(i)).T if t else get(fmt.format(i)) for i in range(L)])
  fused = _fused_groups(config)
  in_fused = {n: (h, group) for h, group in fused.items() for n in group}
  layers: dict = {}
  for h, group in fused.items():
    for kind, t in (("weight", True), ("bias", False)):
      names = [n for n in group if kind == "weight" or n in config.bias_names()]
      if not names:
        continue
      full = stack(f"layers.{{}}.{h}.{kind}", t=t)
      for n, part in zip(group, np.split(full, _row_splits(config, group), axis=-1)):
        layers.setdefault(n, {})["kernel" if kind == "weight" else "bias"] = part
  for n, h in HF_LINEARS.items():
    if n not in in_fused:
      layers[n] = {"kernel": stack(f"layers.{{}}.{h}.weight", t=True)}
  for n in config.bias_names():
    if n not in in_fused:
      layers[n]["bias"] = stack(f"layers.{{}}.{HF_LINEARS[n]}.bias")
  for n, h in vector_modules(config).items():
    layers[n] = stack(f"layers.{{}}.{h}.weight")
  params = {"embed": get("embed_tokens.weight"), "layers": layers, "final_norm": get("norm.weight")}
  if not config.tie_word_embeddings:
    params["lm_head"] = {"kernel": get("lm_head.weight").T}
  leftover = [k for k in sd if k not in used and not k.endswith(UNUSED)
              and not (config.tie_word_embeddings and k == "lm_head.weight")]
  if leftover:
    raise ValueError(f"{source}: {len(leftover)} checkpoint tensor(s) not used by the {config.model_type} "
                     f"import (refusing to drop weights silently): {sorted(leftover)[:8]}")
  _check_shapes(params, config, source)
  return params


def state_dict_from_params(params: dict, config: ModelConfig) -> dict[str, np.ndarray]:
  """The inverse of `params_from_state_dict`: HF names, (out, in) linear weights, NumPy arrays."""
  sd = {"model.embed_tokens.weight": np.asarray(params["embed"]),
        "model.norm.weight": np.asarray(params["final_norm"])}
  layers = params["layers"]
  fused = _fused_groups(config)
  in_fused = {n for group in fused.values() for n in group}
  for i in range(config.num_layers):
    for n, h in HF_LINEARS.items():
      if n not in in_fused:
        sd[f"model.layers.{i}.{h}.weight"] = np.asarray(layers[n]["kernel"][i]).T
    for n in config.bias_names():
      if n not in in_fused:
        sd[f"model.layers.{i}.{HF_LINEARS[n]}.bias"] = np.asarray(layers[n]["bias"][i])
    for h, group in fused.items():
      sd[f"model.layers.{i}.{h}.weight"] = np.concatenate(
          [np.asarray(layers[n]["kernel"][i]).T for n in group], axis=0)
    for n, h in vector_modules(config).items():
      sd[f"model.layers.{i}.{h}.weight"] = np.asarray(layers[n][i])
  if not config.tie_word_embeddings:
    sd["lm_head.weight"] = np.asarray(params["lm_head"]["kernel"]).T
  return {k: np.ascontiguousarray(v) for k, v in sd.items()}


def _check_shapes(params: dict, config: ModelConfig, source: str) -> None:
  c = config
  expect = {"embed": (c.vocab_size, c.hidden_size),
            "q": (c.num_layers, c.hidden_size, c.num_heads * c.head_dim),
            "k": (c.num_layers, c.hidden_size, c.num_kv_heads * c.head_dim),
            "down": (c.num_layers, c.intermediate_size, c.hidden_size)}
  got = {"embed": params["embed"].shape, "q": params["layers"]["q"]["kernel"].shape,
         "k": params["layers"]["k"]["kernel"].shape, "down": params["layers"]["down"]["kernel"].shape}
  for name, shape in expect.items():
    if tuple(got[name]) != shape:
      raise ValueError(f"{source}: {name} has shape {tuple(got[name])}, config expects {shape}")


def load_hf_folder(folder: str | pathlib.Path, dtype=None) -> tuple[dict, ModelConfig]:
  """(params as NumPy, config) from a folder with config.json and *.safetensors."""
  folder = pathlib.Path(folder)
  cfg_path = folder / "config.json"
  if not cfg_path.exists():
    raise FileNotFoundError(f"{folder}: no config.json (is this a Hugging Face checkpoint folder?)")
  hf = read_json(cfg_path)
  config = ModelConfig.from_hf(hf, source=str(cfg_path))
  return params_from_state_dict(read_checkpoint(folder), config, dtype, source=str(folder)), config
