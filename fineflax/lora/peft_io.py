"""PEFT interop: adapter folders that `peft.PeftModel.from_pretrained` loads onto the transformers model,
and merged full checkpoints that `transformers.AutoModelForCausalLM.from_pretrained` loads.

Adapter folder: adapter_config.json + adapter_model.safetensors with, per layer i and linear,
  base_model.model.model.layers.{i}.{self_attn|mlp}.{q_proj..down_proj}.lora_A.weight  (r, in)  = a[i].T
  base_model.model.model.layers.{i}.{self_attn|mlp}.{q_proj..down_proj}.lora_B.weight  (out, r) = b[i].T
Every file is written atomically (temporary file + os.replace).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import tempfile
from typing import Any

import jax
import numpy as np

from fineflax.io import atomic_write_text, read_json
from fineflax.lora.adapters import check_lora, linear_shapes, merge_lora
from fineflax.lora.config import LoraConfig
from fineflax.models.targets import HF_TO_NAME, resolve_targets
from fineflax.models.config import ModelConfig
from fineflax.models.hf_import import HF_LINEARS, state_dict_from_params
from fineflax.models.safetensors_io import read_safetensors, write_safetensors

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_KEY = re.compile(r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])"
                  r"(?:\.default)?\.weight$")


def adapter_config(cfg: LoraConfig, base_model_name_or_path: str | None = None) -> dict[str, Any]:
  """The adapter_config.json fields peft (0.21) reads for a plain LoRA on a causal LM."""
  return {
      "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model_name_or_path,
      "r": cfg.r, "lora_alpha": cfg.alpha, "lora_dropout": cfg.dropout, "use_rslora": cfg.use_rslora,
      "target_modules": sorted(HF_LINEARS[n].split(".")[-1] for n in resolve_targets(cfg.target_modules)),
      "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True, "inference_mode": True,
      "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
      "rank_pattern": {}, "alpha_pattern": {}, "use_dora": False,
  }


def export_peft(lora: dict, cfg: LoraConfig, model_config: ModelConfig, out_dir: str | os.PathLike,
                base_model_name_or_path: str | None = None) -> pathlib.Path:
  """Writes `lora` as a PEFT adapter folder; returns its path. Weights are saved as f32."""
  check_lora(lora, model_config, cfg)
  missing = [n for n in resolve_targets(cfg.target_modules) if n not in lora]
  if missing:
    raise ValueError(f"export_peft: cfg targets {missing} but lora has only {sorted(lora)}")
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  tensors = {}
  for name, ab in lora.items():
    a, b = np.asarray(jax.device_get(ab["a"]), np.float32), np.asarray(jax.device_get(ab["b"]), np.float32)
    for i in range(model_config.num_layers):
      prefix = f"base_model.model.model.layers.{i}.{HF_LINEARS[name]}"
      tensors[f"{prefix}.lora_A.weight"] = a[i].T
      tensors[f"{prefix}.lora_B.weight"] = b[i].T
  cfg = LoraConfig(cfg.r, cfg.alpha, cfg.dropout, tuple(sorted(lora, key=list(HF_LINEARS).index)),
                   cfg.use_rslora)
  write_safetensors(tensors, out / ADAPTER_WEIGHTS, metadata={"format": "pt"})
  atomic_write_text(out / ADAPTER_CONFIG, json.dumps(adapter_config(cfg, base_model_name_or_path), indent=2))
  return out


def import_peft(adapter_dir: str | os.PathLike, model_config: ModelConfig) -> tuple[dict, LoraConfig]:
  """(lora f32, LoraConfig) from a PEFT LoRA folder; errors name the file and the field or key at fault."""
  folder = pathlib.Path(adapter_dir)
  cfg_path, w_path = folder / ADAPTER_CONFIG, folder / ADAPTER_WEIGHTS
  for p in (cfg_path, w_path):
    if not p.exists():
      raise FileNotFoundError(f"{folder}: no {p.name} (is this a PEFT adapter folder?)")
  raw = read_json(cfg_path)
  if raw.get("peft_type") != "LORA":
    raise ValueError(f"{cfg_path}: peft_type={raw.get('peft_type')!r}; only 'LORA' adapters are supported")
  unsupported = {"use_dora": (False, None), "fan_in_fan_out": (False, None), "bias": ("none", None),
                 "rank_pattern": ({}, None), "alpha_pattern": ({}, None), "layers_to_transform": (None,),
                 "modules_to_save": (None, []), "lora_bias": (False, None)}
  for field, ok in unsupported.items():
    if field in raw and raw[field] not in ok:
      raise ValueError(f"{cfg_path}: field {field}={raw[field]!r} is not supported (expected one of {ok})")
  for field in ("r", "lora_alpha"):
    if field not in raw:
      raise ValueError(f"{cfg_path}: missing field {field!r}")
  r = int(raw["r"])
  shapes = linear_shapes(model_config)
  per_layer: dict[str, dict[str, dict[int, np.ndarray]]] = {}
  for key, value in read_safetensors(w_path).items():
    m = _KEY.match(key)
    if m is None or m.group(3) not in HF_TO_NAME:
      raise ValueError(f"{w_path}: unexpected tensor {key!r} (expected base_model.model.model.layers.<i>."
                       f"<self_attn|mlp>.<{'|'.join(HF_TO_NAME)}>.lora_<A|B>.weight)")
    layer, name, ab = int(m.group(1)), HF_TO_NAME[m.group(3)], m.group(4).lower()
    if layer >= model_config.num_layers:
      raise ValueError(f"{w_path}: tensor {key!r} is for layer {layer}, the model has "
                       f"{model_config.num_layers} layers")
    n_in, n_out = shapes[name]
    expected = (r, n_in) if ab == "a" else (n_out, r)
    if tuple(value.shape) != expected:
      raise ValueError(f"{w_path}: tensor {key!r} has shape {tuple(value.shape)}; expected {expected} "
                       f"(r={r} from {ADAPTER_CONFIG}, the linear is {n_in} -> {n_out})")
    per_layer.setdefault(name, {"a": {}, "b": {}})[ab][layer] = np.asarray(value, np.float32).T
  if not per_layer:
    raise ValueError(f"{w_path}: no LoRA tensors")
  lora = {}
  for name in [n for n in HF_LINEARS if n in per_layer]:
    lora[name] = {}
    for ab in ("a", "b"):
      got = per_layer[name][ab]
      missing = [i for i in range(model_config.num_layers) if i not in got]
      if missing:
        raise ValueError(f"{w_path}: {HF_LINEARS[name]}.lora_{ab.upper()} missing for layers {missing}")
      lora[name][ab] = np.stack([got[i] for i in range(model_config.num_layers)])
  cfg = LoraConfig(r=r, alpha=float(raw["lora_alpha"]), dropout=float(raw.get("lora_dropout") or 0.0),
                   target_modules=tuple(lora), use_rslora=bool(raw.get("use_rslora", False)))
  check_lora(lora, model_config, cfg, source=str(w_path))
  return jax.tree_util.tree_map(jax.numpy.asarray, lora), cfg


def export_merged(params: dict, lora: dict, cfg: LoraConfig, model_config: ModelConfig, tokenizer,
                  out_dir: str | os.PathLike, dtype=None) -> pathlib.Path:
  """A transformers checkpoint folder (model.safetensors, config.json, tokenizer files) of the base with
  the adapters merged in (quantised kernels dequantised). `dtype` (default: each tensor's own) casts all."""
  check_lora(lora, model_config, cfg)
  merged = merge_lora(params, lora, cfg, requantize=False)
  sd = state_dict_from_params(jax.device_get(merged), model_config)
  if dtype is not None:
    sd = {k: np.asarray(v, dtype=np.dtype(dtype)) for k, v in sd.items()}
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  write_safetensors(sd, out / "model.safetensors", metadata={"format": "pt"})
  hf = model_config.to_hf()
  hf["dtype"] = str(next(iter(sd.values())).dtype)
  atomic_write_text(out / "config.json", json.dumps(hf, indent=2))
  if tokenizer is not None:
    with tempfile.TemporaryDirectory(dir=out, prefix=".tokenizer.") as tmp:
      tokenizer.save_pretrained(tmp)
      for f in pathlib.Path(tmp).iterdir():
        os.replace(f, out / f.name)
  return out
