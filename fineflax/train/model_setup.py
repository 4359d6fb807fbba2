"""The model a training job starts from: the frozen base (quantised, attention and layer loop as configured),
the LoRA config and its starting adapter; the compute dtype; the trained adapter exported as PEFT."""
from __future__ import annotations

import dataclasses
import logging
import os
import time

import jax

from fineflax import lora as lora_lib
from fineflax.models import load
from fineflax.models.dtype import resolve_dtype
from fineflax.models.layer_loop import resolve_layer_loop
from fineflax.train.sections import ModelSection


def compute_dtype(model: ModelSection):
  """The jnp compute dtype of `config.model.dtype` ("auto": `fineflax.models.dtype.resolve_dtype_name`).
  `model`: the typed config.model, or a job's ConfigDict (read through ModelSection.of)."""
  return resolve_dtype(ModelSection.of(model).dtype)


def setup_model(config, model: ModelSection | None = None):
  """(frozen base params, model config, tokenizer, lora cfg, lora init).

  `model`: the typed config.model built at resolve time (None: built here from `config`); `config`
  supplies config.lora and config.seed.

  The base is quantised per `config.model.quant` on the linears `config.model.quant_targets` (default
  every linear; the grammar of LoRA targets: short names, HF names, "all-linear"); the attention
  kernel is `config.model.attention` (auto, cudnn or xla), the layer loop `config.model.layer_loop`
  (scan, unrolled, or auto: `layer_loop.resolve_layer_loop`).
  """
  model = ModelSection.of(config) if model is None else model
  dtype = compute_dtype(model)
  t0 = time.time()
  params, model_config, tokenizer = load(model.source, dtype=dtype, quant=model.quant,
                                         quant_targets=model.quant_targets)
  model_config = dataclasses.replace(model_config, attention=model.attention,
                                     layer_loop=resolve_layer_loop(model.layer_loop, model.remat))
  lora_cfg = lora_lib.LoraConfig.from_mapping(config.lora)
  init_from = config.lora.get("init_from", "")
  if init_from:
    lora = start_adapter(init_from, model_config, lora_cfg)
  else:
    lora = lora_lib.init_lora(params, model_config, lora_cfg, jax.random.PRNGKey(config.seed + 1))
  logging.info("loaded %s (%s, quant=%s) in %.1fs", model.source, model_config.model_type,
               model.quant, time.time() - t0)
  return params, model_config, tokenizer, lora_cfg, lora


def start_adapter(path: str, model_config, lora_cfg) -> dict:
  """The LoRA of the PEFT folder `path` as the starting point of training (`config.lora.init_from`).

  Its rank, alpha, rslora and adapted linears must equal `config.lora`'s (the scale and the shapes the
  job builds come from there); otherwise a ValueError names both settings."""
  lora, saved = lora_lib.import_peft(path, model_config)
  want = {"r": lora_cfg.r, "alpha": float(lora_cfg.alpha), "rslora": lora_cfg.use_rslora,
          "targets": sorted(lora_lib.resolve_targets(lora_cfg.target_modules))}
  have = {"r": saved.r, "alpha": float(saved.alpha), "rslora": saved.use_rslora, "targets": sorted(lora)}
  if want != have:
    diff = {k: (have[k], want[k]) for k in want if have[k] != want[k]}
    raise ValueError(f"config.lora.init_from={path}: the adapter does not match config.lora "
                     f"(field: (adapter, config)) {diff}")
  return lora


def export_adapter(lora, lora_cfg, model_config, config, workdir: str) -> str:
  """The LoRA as a PEFT adapter in WORKDIR/adapter (loadable by `peft` onto the transformers model);
  written by process 0 only (`fineflax.train.distributed.is_writer`)."""
  from fineflax.train.distributed import is_writer
  path = os.path.join(workdir, "adapter")
  if not is_writer():
    return path
  lora_lib.export_peft(lora, lora_cfg, model_config, path, base_model_name_or_path=str(config.model.source))
  return path
