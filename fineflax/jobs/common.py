"""Pieces every training job shares: model + adapters setup, sampling a prompt, workdir handling."""
from __future__ import annotations

import dataclasses
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from fineflax import lora as lora_lib
from fineflax.io import read_json
from fineflax.lora.peft_io import peft_files
from fineflax.models import load
from fineflax.models.dtype import resolve_dtype
from fineflax.models.layer_loop import resolve_layer_loop
from fineflax.sampling import chat_prompt_ids, generate
from fineflax.train.checkpoint import latest_checkpoint_step
from fineflax.train.loop import LoopResult, already_complete_line, write_summary
from fineflax.train.run_config import check_resumable, check_workdir



def compute_dtype(config):
  """The jnp compute dtype of `config.model.dtype` ("auto": `fineflax.models.dtype.resolve_dtype_name`)."""
  return resolve_dtype(config.model.dtype)


def make_workdir(config, workdir: str | None) -> str:
  workdir = workdir or os.path.join("runs", f"{config.job}-{time.strftime('%Y%m%d-%H%M%S')}")
  check_workdir(workdir)
  os.makedirs(workdir, exist_ok=True)
  return workdir


def preflight(config, workdir: str | None, num_steps: int) -> dict | None:
  """The checks that need no weights, made before the model loads: the PEFT folder of `lora.init_from`
  exists, the workdir can be made (`WorkdirError`), its checkpoints belong to this config
  (`ConfigChanged`; with resume=false the loop moves them aside later), and whether the run is already
  complete at `num_steps`: then the loop's "already complete" line is printed and the saved summary
  returned (None: the run has work to do)."""
  if config.get("lora") is not None and config.lora.get("init_from", ""):
    peft_files(config.lora.init_from)
  if workdir is None:  # a fresh runs/<job>-<time> folder
    return None
  check_workdir(workdir)
  check_resumable(config, workdir, write=False)
  step = latest_checkpoint_step(os.path.join(workdir, "checkpoints"))
  if step is None or step < num_steps or not config.get("resume", True):
    return None
  print(already_complete_line(step, num_steps, workdir), flush=True)
  return saved_summary(workdir, step)


def saved_summary(workdir: str, step: int) -> dict:
  """WORKDIR/summary.json of a run already complete (a stand-in naming the step if it was never written)."""
  path = os.path.join(workdir, "summary.json")
  return read_json(path) if os.path.exists(path) else {"status": "already complete", "step": step}


def setup_model(config):
  """(frozen base params, model config, tokenizer, lora cfg, lora init).

  The base is quantised per `config.model.quant` on the linears `config.model.quant_targets` (default
  every linear; the grammar of LoRA targets: short names, HF names, "all-linear"); the attention
  kernel is `config.model.attention` (auto, cudnn or xla), the layer loop `config.model.layer_loop`
  (scan, unrolled, or auto: `layer_loop.resolve_layer_loop`).
  """
  dtype = compute_dtype(config)
  t0 = time.time()
  params, model_config, tokenizer = load(config.model.source, dtype=dtype, quant=config.model.quant,
                                         quant_targets=tuple(config.model.get("quant_targets", ("all-linear",))))
  model_config = dataclasses.replace(model_config, attention=config.model.get("attention", "auto"),
                                     layer_loop=resolve_layer_loop(config.model.get("layer_loop", "scan"),
                                                                   config.model.remat))
  lora_cfg = lora_lib.LoraConfig.from_mapping(config.lora)
  init_from = config.lora.get("init_from", "")
  if init_from:
    lora = start_adapter(init_from, model_config, lora_cfg)
  else:
    lora = lora_lib.init_lora(params, model_config, lora_cfg, jax.random.PRNGKey(config.seed + 1))
  logging.info("loaded %s (%s, quant=%s) in %.1fs", config.model.source, model_config.model_type,
               config.model.quant, time.time() - t0)
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


def finish_run(workdir: str, result: LoopResult, export, **extra) -> dict:
  """The run's summary: an already-complete run returns its saved summary and writes nothing; otherwise
  `export()` (the adapter path) and `write_summary`."""
  if result.status == "already complete":
    return saved_summary(workdir, result.step)
  return write_summary(workdir, result, adapter=export(), **extra)


def answer(params, model_config, tokenizer, prompt: str, *, lora=None, lora_scale=1.0,
           max_new_tokens=64, dtype=jnp.float32, system_prompt: str = "", temperature: float = 0.0,
           top_k: int = 0, top_p: float = 1.0, rng=None) -> str:
  """The chat model's reply to one user message (greedy unless `temperature` > 0)."""
  messages = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
  messages.append({"role": "user", "content": prompt})
  ids = chat_prompt_ids(tokenizer, messages)
  out = generate(params, model_config, [ids], max_new_tokens=max_new_tokens, temperature=temperature,
                 top_k=top_k, top_p=top_p, rng=rng, tokenizer=tokenizer, lora=lora, lora_scale=lora_scale,
                 dtype=dtype)
  return out.texts[0]


def stack_micro_batches(batches: list[dict], pad_id: int) -> dict[str, np.ndarray]:
  """[A, B, T] arrays from A micro-batches, right-padding each to the widest T (padding is inert)."""
  width = max(b["tokens"].shape[1] for b in batches)
  def pad(name, a):
    value = pad_id if name == "tokens" else 0
    return np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=value)
  return {k: np.stack([pad(k, b[k]) for b in batches]) for k in batches[0]}
