"""Pieces every training job shares: model + adapters setup, sampling a prompt, workdir handling."""
from __future__ import annotations

import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from fineflax import lora as lora_lib
from fineflax import quant
from fineflax.models import load
from fineflax.sampling import format_chat, generate

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def compute_dtype(config):
  if config.model.dtype not in DTYPES:
    raise ValueError(f"config.model.dtype={config.model.dtype!r}; choose one of {sorted(DTYPES)}")
  return DTYPES[config.model.dtype]


def make_workdir(config, workdir: str | None) -> str:
  workdir = workdir or os.path.join("runs", f"{config.job}-{time.strftime('%Y%m%d-%H%M%S')}")
  os.makedirs(workdir, exist_ok=True)
  return workdir


def setup_model(config):
  """(frozen base params (quantised per config.model.quant), model config, tokenizer, lora cfg, lora init)."""
  dtype = compute_dtype(config)
  t0 = time.time()
  params, model_config, tokenizer = load(config.model.source, dtype=dtype)
  if config.model.quant != "none":
    params = quant.quantize_params(params, targets=tuple(config.lora.targets), kind=config.model.quant)
  lora_cfg = lora_lib.LoraConfig.from_mapping(config.lora)
  lora = lora_lib.init_lora(params, model_config, lora_cfg, jax.random.PRNGKey(config.seed + 1))
  logging.info("loaded %s (%s, quant=%s) in %.1fs", config.model.source, model_config.model_type,
               config.model.quant, time.time() - t0)
  return params, model_config, tokenizer, lora_cfg, lora


def answer(params, model_config, tokenizer, prompt: str, *, lora=None, lora_scale=1.0,
           max_new_tokens=64, dtype=jnp.float32, system_prompt: str = "", temperature: float = 0.0,
           top_k: int = 0, top_p: float = 1.0, rng=None) -> str:
  """The chat model's reply to one user message (greedy unless `temperature` > 0)."""
  messages = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
  messages.append({"role": "user", "content": prompt})
  ids = tokenizer(format_chat(tokenizer, messages), add_special_tokens=False)["input_ids"]
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
