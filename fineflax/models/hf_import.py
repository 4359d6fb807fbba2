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


def _layer_names(config: ModelConfig) -> tuple[list[str], list[str]]:
  vectors = ["attn_norm", "mlp_norm"] + (["q_norm", "k_norm"] if config.qk_norm else [])
  biases = ["q", "k", "v"] if config.attention_bias else []
  return vectors, biases


def params_from_state_dict(sd: Mapping[str, np.ndarray], config: ModelConfig,
                           dtype=None, source: str = "checkpoint") -> dict:
  """Stacks per-layer HF tensors into the fineflax pytree (NumPy). Linear weights (out, in) -> (in, out).

  Missing tensors raise an error naming them; `dtype` (a NumPy dtype) casts every array.
  """
  sd = {k.removeprefix("model.") if k.startswith("model.") else k: v for k, v in sd.items()}
  cast = (lambda a: np.asarray(a, dtype=dtype)) if dtype is not None else np.asarray
  def get(name):
    if name not in sd:
      raise KeyError(f"{source}: tensor {name!r} not found (have e.g. {sorted(sd)[:6]})")
    return sd[name]
  L = config.num_layers
  stack = lambda fmt, t=False: np.stack(
      [cast(get(fmt.format(i))).T if t else cast(get(fmt.format(i))) for i in range(L)])
  layers = {n: {"kernel": stack(f"layers.{{}}.{h}.weight", t=True)} for n, h in HF_LINEARS.items()}
  vectors, biases = _layer_names(config)
  for n in biases:
    layers[n]["bias"] = stack(f"layers.{{}}.{HF_LINEARS[n]}.bias")
  for n in vectors:
    layers[n] = stack(f"layers.{{}}.{HF_VECTORS[n]}.weight")
  params = {"embed": cast(get("embed_tokens.weight")), "layers": layers,
            "final_norm": cast(get("norm.weight"))}
  if not config.tie_word_embeddings:
    params["lm_head"] = {"kernel": cast(get("lm_head.weight")).T}
  _check_shapes(params, config, source)
  return params


def state_dict_from_params(params: dict, config: ModelConfig) -> dict[str, np.ndarray]:
  """The inverse of `params_from_state_dict`: HF names, (out, in) linear weights, NumPy arrays."""
  sd = {"model.embed_tokens.weight": np.asarray(params["embed"]),
        "model.norm.weight": np.asarray(params["final_norm"])}
  layers = params["layers"]
  vectors, biases = _layer_names(config)
  for i in range(config.num_layers):
    for n, h in HF_LINEARS.items():
      sd[f"model.layers.{i}.{h}.weight"] = np.asarray(layers[n]["kernel"][i]).T
    for n in biases:
      sd[f"model.layers.{i}.{HF_LINEARS[n]}.bias"] = np.asarray(layers[n]["bias"][i])
    for n in vectors:
      sd[f"model.layers.{i}.{HF_VECTORS[n]}.weight"] = np.asarray(layers[n][i])
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
