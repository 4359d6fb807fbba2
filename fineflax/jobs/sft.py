"""SFT job: LoRA/QLoRA or full-parameter (config.train.params) fine-tuning on chat data, with eval,
checkpoints, TensorBoard and a PEFT export (full: a merged Hugging Face folder)."""
from __future__ import annotations

import math
import os
import time

import jax
from clu import metrics as clu_metrics

from fineflax import lora as lora_lib
from fineflax.config_checks import lookup, non_negative_int, one_of, positive_int, require
from fineflax.data import build_mixture, load_sources, make_batch_iterator
from fineflax.data.packing import repack
from fineflax.data.iterator import pad_id_of
from fineflax.jobs import resolve
from fineflax.sampling.answer import answer
from fineflax.train.loop import Hooks, train_loop
from fineflax.mesh import make_mesh, shard_batch
from fineflax.train.model_setup import compute_dtype, setup_model
from fineflax.train.optim import make_optimizer, make_schedule
from fineflax.train.sft_step import make_sft_fns, make_sft_micro_step, stack_micro_batches
from fineflax.train.trainable import (export_trained, init_placed_state, loss_head, moment_dtype, pin_state,
                                     split_model)
from fineflax.train.workdir import finish_run, make_workdir, preflight


def _batches(mixture, tokenizer, data_cfg):
  return make_batch_iterator(mixture, tokenizer, batch_size=data_cfg.batch_size,
                             max_length=data_cfg.max_length, packing=data_cfg.packing,
                             truncation=data_cfg.truncation)


def evaluate(eval_fn, params, base, config, tokenizer, mesh, eval_entries) -> dict:
  """Token-weighted eval loss and perplexity over the first `config.data.eval_batches` batches of the
  eval set (the same batches at every evaluation)."""
  if not eval_entries:
    return {}
  it = _batches(build_mixture(eval_entries, seed=1234), tokenizer, config.data)
  avg = None
  for _ in range(config.data.eval_batches):
    total, count = eval_fn(params, base, shard_batch(next(it), mesh))
    batch_avg = clu_metrics.Average(total=total, count=count)  # token-weighted mean NLL
    avg = batch_avg if avg is None else avg.merge(batch_avg)
  loss = float(avg.compute())
  return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0))}


def validate(config) -> None:
  """Data fields with a bounded domain."""
  from fineflax.data.schemas import SCHEMAS
  for key in ("data.batch_size", "data.max_length", "data.grad_accum", "data.eval_batches"):
    positive_int(config, key)
  require(config, "train.micro_batch_tokens", *non_negative_int(" (0 = data.grad_accum padded batches)"))
  tokens = lookup(config, "train.micro_batch_tokens", 0)
  if tokens and tokens < config.data.max_length:
    require(config, "train.micro_batch_tokens", lambda v: False,
            f"0 (off) or at least data.max_length={config.data.max_length} (a whole sequence)")
  one_of(config, "data.truncation", ("right", "left", "drop"))
  one_of(config, "data.on_bad_row", ("error", "skip"))
  one_of(config, "data.schema", ("auto", *SCHEMAS))


def run(config, workdir: str | None) -> dict:
  resolve.validate(config)  # the one pass (this job's `validate` is part of it)
  done = preflight(config, workdir, config.optimizer.num_steps)
  if done is not None:
    return done
  sources = load_sources(config.data.sources, config.data)  # data files are read before the model loads
  eval_entries = load_sources(config.data.eval_sources, config.data) if config.data.eval_sources else []
  dtype = compute_dtype(config)
  base, model_config, tokenizer, lora_cfg, lora = setup_model(config)
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp)
  trainable = split_model(config, base, lora).place(mesh)  # LoRA + frozen base, or the full params
  base = trainable.base  # None in full training
  scale = lora_lib.lora_scale(lora_cfg)
  opt_cfg = config.optimizer
  optimizer, schedule = make_optimizer(opt_cfg, moment_dtype(config)), make_schedule(opt_cfg)
  train_fn, eval_fn = make_sft_fns(optimizer, donate=trainable.donate, model_config=model_config, lora_scale=scale,
                                   lora_dropout=lora_cfg.dropout, remat=config.model.remat, dtype=dtype,
                                   logits_chunk=config.model.logits_chunk, loss_head=loss_head(config),
                                   causal_prefix=not config.data.packing)  # unpacked rows are right-padded
  state = init_placed_state(trainable.params, optimizer, config.seed, mesh, trainable.full)
  train_fn = pin_state(train_fn, state, trainable.donate)
  batches = _batches(build_mixture(sources, seed=config.seed), tokenizer, config.data)
  pad_id = pad_id_of(tokenizer)
  workdir = make_workdir(config, workdir)  # after every input was read: a failed start leaves no folder
  def sample(params) -> str:  # the answer of the model of these trainable params
    weights, lora_ = trainable.weights(params)
    return answer(weights, model_config, tokenizer, config.sample_prompt, lora=lora_, lora_scale=scale,
                  dtype=dtype, max_new_tokens=config.sample_max_new_tokens)
  if config.sample_prompt and not os.path.exists(os.path.join(workdir, "checkpoints")):
    print(f"\n[before] {config.sample_prompt}\n{sample(state['params'])}\n", flush=True)
  throughput = {"t": time.time(), "tokens": 0.0}

  micro_tokens = lookup(config, "train.micro_batch_tokens", 0)  # packed micro-batches (fineflax.data.packing.repack)
  micro_fn = make_sft_micro_step(optimizer, donate=trainable.donate, model_config=model_config, lora_scale=scale,
                                 lora_dropout=lora_cfg.dropout, remat=config.model.remat, dtype=dtype,
                                 logits_chunk=config.model.logits_chunk,
                                 loss_head=loss_head(config)) if micro_tokens else None

  def step(state, step: int):
    grouped = [next(batches) for _ in range(config.data.grad_accum)]
    if micro_fn is not None:
      state, metrics = micro_fn(state, base, repack(grouped, micro_tokens, mesh.devices.size, pad_id), mesh)
    else:
      state, metrics = train_fn(state, base, shard_batch(stack_micro_batches(grouped, pad_id), mesh, batch_axis=1))
    metrics = jax.device_get(metrics)
    throughput["tokens"] += float(metrics["tokens"])
    scalars = {"train_loss": float(metrics["loss"]),
               "grad_norm": float(metrics["grad_norm"])}
    if step % config.log_every == 0 or step % config.eval_every == 0 or step == opt_cfg.num_steps:
      now = time.time()
      scalars["tokens_per_s"] = throughput["tokens"] / max(now - throughput["t"], 1e-9)
      throughput.update(t=now, tokens=0.0)
      scalars["learning_rate"] = float(schedule(step - 1))
    return state, scalars

  hooks = Hooks(step=step, eval_metric="eval_loss" if eval_entries else "", eval_mode="min",
                evaluate=lambda st: evaluate(eval_fn, st["params"], base, config, tokenizer, mesh, eval_entries),
                meta=lambda: {"data": batches.state()}, restore_meta=lambda m: batches.restore(m["data"]),
                postfix=("train_loss", "grad_norm"), loss_key="train_loss")
  result = train_loop(hooks, state, config, workdir, num_steps=opt_cfg.num_steps, desc="sft",
                      eval_every=config.eval_every)
  state = result.state
  extra = {"data": batches.summary()}  # rows read, skipped (first lines), dropped by reason, per source
  if config.sample_prompt and result.status == "completed":
    extra["sample_after"] = sample(state["params"])
    print(f"\n[after] {config.sample_prompt}\n{extra['sample_after']}\n", flush=True)
  return finish_run(workdir, result, lambda: export_trained(trainable, state["params"], lora_cfg=lora_cfg,
                                                            model_config=model_config, tokenizer=tokenizer,
                                                            config=config, workdir=workdir), **extra)
