"""PEFT interop: adapter folders that `peft.PeftModel.from_pretrained` loads onto the transformers model,
and merged full checkpoints that `transformers.AutoModelForCausalLM.from_pretrained` loads.

Adapter folder: adapter_config.json + adapter_model.safetensors with, per layer i and linear,
  base_model.model.model.layers.{i}.{self_attn|mlp}.{q_proj..down_proj}.lora_A.weight  (r, in)  = a[i].T
  base_model.model.model.layers.{i}.{self_attn|mlp}.{q_proj..down_proj}.lora_B.weight  (out, r) = b[i].T
Phi-3's fused modules (qkv_proj, gate_up_proj) hold the adapters of the linears fineflax splits them into:
export stacks their A's along the rank (rank k*r for k adapted members) with a block-diagonal B and
`rank_pattern` / `alpha_pattern` entries that keep the scale; import splits B's rows (one shared A), so any
PEFT Phi-3 adapter loads exactly. Modules of different ranks are zero-padded to the largest on import,
their scale folded into B.
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
from fineflax.lora.config import LoraConfig, lora_scale
from fineflax.models.targets import HF_FUSED, HF_TO_NAME, resolve_targets
from fineflax.models.config import ModelConfig
from fineflax.models.hf_import import FUSED, HF_LINEARS, state_dict_from_params
from fineflax.models.safetensors_io import read_safetensors, write_safetensors
from fineflax.quant import dequantize_params

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_KEY = re.compile(r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])"
                  r"(?:\.default)?\.weight$")


def adapter_config(cfg: LoraConfig, base_model_name_or_path: str | None = None, target_modules=None,
                   rank_pattern=None, alpha_pattern=None) -> dict[str, Any]:
  """The adapter_config.json fields peft (0.21) reads for a plain LoRA on a causal LM."""
  if target_modules is None:
    target_modules = [HF_LINEARS[n].split(".")[-1] for n in resolve_targets(cfg.target_modules)]
  return {
      "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model_name_or_path,
      "r": cfg.r, "lora_alpha": cfg.alpha, "lora_dropout": cfg.dropout, "use_rslora": cfg.use_rslora,
      "target_modules": sorted(target_modules),
      "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True, "inference_mode": True,
      "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
      "rank_pattern": dict(rank_pattern or {}), "alpha_pattern": dict(alpha_pattern or {}), "use_dora": False,
  }


def hf_modules(model_config: ModelConfig) -> list[tuple[str, tuple[str, ...]]]:
  """(HF module path in a layer, the fineflax linears it holds) for this family, in HF_LINEARS order."""
  fused = FUSED.get(model_config.model_type, {})
  member_of = {n: h for h, group in fused.items() for n in group}
  out, seen = [], set()
  for n, path in HF_LINEARS.items():
    h = member_of.get(n, path)
    if h not in seen:
      seen.add(h)
      out.append((h, fused.get(h, (n,))))
  return out


def export_peft(lora: dict, cfg: LoraConfig, model_config: ModelConfig, out_dir: str | os.PathLike,
                base_model_name_or_path: str | None = None) -> pathlib.Path:
  """Writes `lora` as a PEFT adapter folder; returns its path. Weights are saved as f32."""
  check_lora(lora, model_config, cfg)
  missing = [n for n in resolve_targets(cfg.target_modules) if n not in lora]
  if missing:
    raise ValueError(f"export_peft: cfg targets {missing} but lora has only {sorted(lora)}")
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  host = {n: (np.asarray(jax.device_get(ab["a"]), np.float32), np.asarray(jax.device_get(ab["b"]), np.float32))
          for n, ab in lora.items()}
  shapes = model_config.linear_shapes()
  tensors, modules, rank_pattern, alpha_pattern = {}, [], {}, {}
  for path, members in hf_modules(model_config):
    present = [n for n in members if n in host]
    if not present:
      continue
    module = path.split(".")[-1]
    modules.append(module)
    a = np.concatenate([host[n][0] for n in present], axis=-1)  # [L, in, k r]
    offsets = dict(zip(members, np.cumsum([0] + [shapes[n][1] for n in members])))
    b = np.zeros((model_config.num_layers, a.shape[-1], sum(shapes[n][1] for n in members)), np.float32)
    for j, n in enumerate(present):
      b[:, j * cfg.r:(j + 1) * cfg.r, offsets[n]:offsets[n] + shapes[n][1]] = host[n][1]
    if len(present) > 1:  # same scale at rank k r: alpha k (rsLoRA: alpha sqrt(k))
      k = len(present)
      rank_pattern[module] = k * cfg.r
      alpha_pattern[module] = cfg.alpha * (k ** 0.5 if cfg.use_rslora else k)
    for i in range(model_config.num_layers):
      prefix = f"base_model.model.model.layers.{i}.{path}"
      tensors[f"{prefix}.lora_A.weight"] = a[i].T
      tensors[f"{prefix}.lora_B.weight"] = b[i].T
  cfg = LoraConfig(cfg.r, cfg.alpha, cfg.dropout, tuple(sorted(lora, key=list(HF_LINEARS).index)),
                   cfg.use_rslora)
  write_safetensors(tensors, out / ADAPTER_WEIGHTS, metadata={"format": "pt"})
  atomic_write_text(out / ADAPTER_CONFIG, json.dumps(adapter_config(
      cfg, base_model_name_or_path, modules, rank_pattern, alpha_pattern), indent=2))
  return out


def _pattern(pattern: dict, module_name: str, default):
  """peft's per-module override: the first key k with module_name matching (.*\\.)?k$."""
  for key, value in (pattern or {}).items():
    if re.match(rf"(.*\.)?({key})$", module_name):
      return value
  return default


def peft_files(adapter_dir: str | os.PathLike) -> tuple[pathlib.Path, pathlib.Path]:
  """(adapter_config.json, adapter_model.safetensors) of a PEFT folder; FileNotFoundError naming the
  folder and the missing file (checked before a job loads its model)."""
  folder = pathlib.Path(adapter_dir)
  paths = folder / ADAPTER_CONFIG, folder / ADAPTER_WEIGHTS
  for p in paths:
    if not p.exists():
      raise FileNotFoundError(f"{folder}: no {p.name} (is this a PEFT adapter folder?)")
  return paths


def import_peft(adapter_dir: str | os.PathLike, model_config: ModelConfig) -> tuple[dict, LoraConfig]:
  """(lora f32, LoraConfig) from a PEFT LoRA folder; errors name the file and the field or key at fault.

  Per-module ranks / alphas (`rank_pattern`, `alpha_pattern`, uniform over layers) are honoured: every
  adapter is zero-padded to the largest rank and its scale relative to the global one folded into b, so
  the forward pass is unchanged. Fused Phi-3 modules are split into their linears (shared a, b by rows).
  """
  cfg_path, w_path = peft_files(adapter_dir)
  raw = read_json(cfg_path)
  if raw.get("peft_type") != "LORA":
    raise ValueError(f"{cfg_path}: peft_type={raw.get('peft_type')!r}; only 'LORA' adapters are supported")
  unsupported = {"use_dora": (False, None), "fan_in_fan_out": (False, None), "bias": ("none", None),
                 "layers_to_transform": (None,), "modules_to_save": (None, []), "lora_bias": (False, None)}
  for field, ok in unsupported.items():
    if field in raw and raw[field] not in ok:
      raise ValueError(f"{cfg_path}: field {field}={raw[field]!r} is not supported (expected one of {ok})")
  for field in ("r", "lora_alpha"):
    if field not in raw:
      raise ValueError(f"{cfg_path}: missing field {field!r}")
  r, alpha, rslora = int(raw["r"]), float(raw["lora_alpha"]), bool(raw.get("use_rslora", False))
  shapes = linear_shapes(model_config)
  modules = dict(hf_modules(model_config))
  by_name = {path.split(".")[-1]: (path, members) for path, members in modules.items()}
  per_module: dict[str, dict[str, dict[int, np.ndarray]]] = {}
  ranks: dict[str, set] = {}
  for key, value in read_safetensors(w_path).items():
    m = _KEY.match(key)
    if m is None or m.group(3) not in by_name or f"{m.group(2)}.{m.group(3)}" not in modules:
      names = "|".join(by_name)
      raise ValueError(f"{w_path}: unexpected tensor {key!r} (expected base_model.model.model.layers.<i>."
                       f"<self_attn|mlp>.<{names}>.lora_<A|B>.weight)")
    layer, module, ab = int(m.group(1)), m.group(3), m.group(4).lower()
    path, members = by_name[module]
    if layer >= model_config.num_layers:
      raise ValueError(f"{w_path}: tensor {key!r} is for layer {layer}, the model has "
                       f"{model_config.num_layers} layers")
    rank = int(_pattern(raw.get("rank_pattern"), f"model.layers.{layer}.{path}", r))
    ranks.setdefault(module, set()).add(rank)
    n_in, n_out = shapes[members[0]][0], sum(shapes[n][1] for n in members)
    expected = (rank, n_in) if ab == "a" else (n_out, rank)
    if tuple(value.shape) != expected:
      raise ValueError(f"{w_path}: tensor {key!r} has shape {tuple(value.shape)}; expected {expected} "
                       f"(r={rank} from {ADAPTER_CONFIG}, the linear is {n_in} -> {n_out})")
    per_module.setdefault(module, {"a": {}, "b": {}})[ab][layer] = np.asarray(value, np.float32).T
  if not per_module:
    raise ValueError(f"{w_path}: no LoRA tensors")
  if any(len(v) > 1 for v in ranks.values()):
    raise ValueError(f"{cfg_path}: rank_pattern gives a module different ranks in different layers; "
                     "fineflax stacks layers and needs one rank per module")
  top = max(next(iter(v)) for v in ranks.values())
  scale = lora_scale(LoraConfig(r=r, alpha=alpha, use_rslora=rslora))
  lora = {}
  for path, members in modules.items():
    module = path.split(".")[-1]
    if module not in per_module:
      continue
    stacked = {}
    for ab in ("a", "b"):
      got = per_module[module][ab]
      missing = [i for i in range(model_config.num_layers) if i not in got]
      if missing:
        raise ValueError(f"{w_path}: {path}.lora_{ab.upper()} missing for layers {missing}")
      stacked[ab] = np.stack([got[i] for i in range(model_config.num_layers)])
    rank = next(iter(ranks[module]))
    m_alpha = float(_pattern(raw.get("alpha_pattern"), f"model.layers.0.{path}", alpha))
    factor = lora_scale(LoraConfig(r=rank, alpha=m_alpha, use_rslora=rslora)) / scale
    a = np.pad(stacked["a"], ((0, 0), (0, 0), (0, top - rank)))
    b = np.pad(stacked["b"] * np.float32(factor) if factor != 1.0 else stacked["b"],
               ((0, 0), (0, top - rank), (0, 0)))
    offsets = np.cumsum([0] + [shapes[n][1] for n in members])
    for j, n in enumerate(members):
      lora[n] = {"a": a, "b": np.ascontiguousarray(b[..., offsets[j]:offsets[j + 1]])}
  lora = {n: lora[n] for n in HF_LINEARS if n in lora}
  if top != r:
    alpha = scale * (top ** 0.5 if rslora else top)
  cfg = LoraConfig(r=top, alpha=alpha, dropout=float(raw.get("lora_dropout") or 0.0),
                   target_modules=tuple(lora), use_rslora=rslora)
  check_lora(lora, model_config, cfg, source=str(w_path))
  return jax.tree_util.tree_map(jax.numpy.asarray, lora), cfg


def export_merged(params: dict, lora: dict, cfg: LoraConfig, model_config: ModelConfig, tokenizer,
                  out_dir: str | os.PathLike, dtype=None) -> pathlib.Path:
  """A transformers checkpoint folder (model.safetensors, config.json, tokenizer files) of the base with
  the adapters merged in (quantised kernels dequantised). `dtype` (default: each tensor's own) casts all."""
  check_lora(lora, model_config, cfg)
  merged = dequantize_params(merge_lora(params, lora, cfg, requantize=False))  # un-adapted kernels too
  return export_hf(merged, model_config, tokenizer, out_dir, dtype)


def export_hf(params: dict, model_config: ModelConfig, tokenizer, out_dir: str | os.PathLike,
              dtype=None) -> pathlib.Path:
  """A transformers checkpoint folder (model.safetensors, config.json, tokenizer files) of dense `params`
  (a fully trained model, or `export_merged`'s merge). `dtype` (default: each tensor's own) casts all."""
  sd = state_dict_from_params(jax.device_get(params), model_config)
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
