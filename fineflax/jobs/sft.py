"""SFT job: LoRA/QLoRA fine-tuning on chat data, with eval, checkpoints, TensorBoard and a PEFT export."""
from __future__ import annotations

import json
import logging
import math
import os
import time

import jax
import numpy as np
from clu import metrics as clu_metrics
from tqdm import tqdm

from fineflax import lora as lora_lib
from fineflax.data import build_mixture, load_source, make_batch_iterator
from fineflax.data.iterator import pad_id_of
from fineflax.io import atomic_write_text
from fineflax.jobs.common import answer, compute_dtype, make_workdir, setup_model, stack_micro_batches
from fineflax.train.checkpoint import Checkpointer
from fineflax.train.mesh import make_mesh, replicate, shard_batch, shard_params
from fineflax.train.metric_writer import MetricWriter
from fineflax.train.optim import make_optimizer, make_schedule
from fineflax.train.sft_step import init_state, make_sft_fns
from fineflax.train.signals import StopRequested


def load_sources(spec: str, data_cfg) -> list[dict]:
  """`build_mixture` entries with loaded sources from "path[:weight],..."; a bare name that is no
  file is a bundled sample ("sample:NAME")."""
  entries = []
  for item in [s.strip() for s in spec.split(",") if s.strip()]:
    path, weight = item, "1"
    if ":" in item and _is_number(item.rsplit(":", 1)[1]):
      path, weight = item.rsplit(":", 1)
    if not os.path.exists(path) and "/" not in path and not path.startswith("sample:"):
      path = "sample:" + path
    entries.append({"source": load_source(path, schema=data_cfg.schema, on_bad_row=data_cfg.on_bad_row),
                    "weight": float(weight)})
  if not entries:
    raise ValueError(f"config.data sources {spec!r} name no source")
  return entries


def _is_number(s: str) -> bool:
  try:
    float(s)
    return True
  except ValueError:
    return False


def _batches(mixture, tokenizer, data_cfg):
  return make_batch_iterator(mixture, tokenizer, batch_size=data_cfg.batch_size,
                             max_length=data_cfg.max_length, packing=data_cfg.packing,
                             truncation=data_cfg.truncation)


def evaluate(eval_fn, lora, base, config, tokenizer, mesh, eval_entries) -> dict:
  """Token-weighted eval loss and perplexity over the first `config.data.eval_batches` batches of the
  eval set (the same batches at every evaluation)."""
  if not eval_entries:
    return {}
  it = _batches(build_mixture(eval_entries, seed=1234), tokenizer, config.data)
  avg = None
  for _ in range(config.data.eval_batches):
    total, count = eval_fn(lora, base, shard_batch(next(it), mesh))
    batch_avg = clu_metrics.Average(total=total, count=count)  # token-weighted mean NLL
    avg = batch_avg if avg is None else avg.merge(batch_avg)
  loss = float(avg.compute())
  return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0))}


def run(config, workdir: str | None) -> dict:
  workdir = make_workdir(config, workdir)
  dtype = compute_dtype(config)
  base, model_config, tokenizer, lora_cfg, lora = setup_model(config)
  scale = lora_lib.lora_scale(lora_cfg)
  opt_cfg = config.optimizer
  optimizer, schedule = make_optimizer(opt_cfg), make_schedule(opt_cfg)
  train_fn, eval_fn = make_sft_fns(optimizer, model_config=model_config, lora_scale=scale,
                                   lora_dropout=lora_cfg.dropout, remat=config.model.remat, dtype=dtype,
                                   logits_chunk=config.model.logits_chunk)
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp)
  base = shard_params(base, mesh)
  state = replicate(init_state(lora, optimizer, config.seed), mesh)
  batches = _batches(build_mixture(load_sources(config.data.sources, config.data), seed=config.seed),
                     tokenizer, config.data)
  eval_entries = load_sources(config.data.eval_sources, config.data) if config.data.eval_sources else []
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep_last=config.checkpoint.keep_last,
                      keep_best=config.checkpoint.keep_best, best_metric="eval_loss", best_mode="min")
  restored = ckpt.restore(state)
  if restored is not None:
    state, meta = restored
    batches.restore(meta["data"])
    logging.info("resumed from step %d in %s", int(state["step"]), ckpt.directory)
  elif config.sample_prompt:
    before = answer(base, model_config, tokenizer, config.sample_prompt, dtype=dtype,
                    max_new_tokens=config.sample_max_new_tokens)
    print(f"\n[before] {config.sample_prompt}\n{before}\n", flush=True)
  writer = MetricWriter(os.path.join(workdir, "logs"))
  pad_id = pad_id_of(tokenizer)
  start = int(state["step"])
  status, last_good = "completed", start
  meta_of = lambda: {"data": batches.state(), "config": config.to_dict()}
  bar = tqdm(total=opt_cfg.num_steps, initial=start, desc="sft", dynamic_ncols=True)
  t_last, tokens_since = time.time(), 0.0
  with StopRequested() as stop:
    for step in range(start + 1, opt_cfg.num_steps + 1):
      batch = stack_micro_batches([next(batches) for _ in range(config.data.grad_accum)], pad_id)
      batch = shard_batch(batch, mesh, batch_axis=1)
      new_state, metrics = train_fn(state, base, batch)
      metrics = jax.device_get(metrics)
      if not np.isfinite(metrics["loss"]):
        status = f"stopped: non-finite loss {metrics['loss']} at step {step}"
        break
      state, tokens_since = new_state, tokens_since + float(metrics["tokens"])
      do_eval = step % config.eval_every == 0 or step == opt_cfg.num_steps
      scalars = {"train_loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"])}
      if step % config.log_every == 0 or do_eval:
        now = time.time()
        scalars["tokens_per_s"] = tokens_since / max(now - t_last, 1e-9)
        t_last, tokens_since = now, 0.0
        scalars["learning_rate"] = float(schedule(step - 1))
      if do_eval:
        scalars.update(evaluate(eval_fn, state["lora"], base, config, tokenizer, mesh, eval_entries))
      writer.write_scalars(step, scalars)
      bar.set_postfix({k: f"{v:.4g}" for k, v in scalars.items() if k != "learning_rate"})
      bar.update(1)
      stopping = bool(stop)  # polled once a step
      if step % config.checkpoint.every == 0 or step == opt_cfg.num_steps or stopping:
        if not ckpt.save(step, state, meta_of(), metrics=_ckpt_metrics(scalars)):
          status = f"stopped: checkpoint at step {step} could not be written (disk full?)"
          break
        last_good = step
      if stopping:
        status = f"stopped by {stop.signal_name} at step {step}"
        break
  bar.close()
  writer.close()
  ckpt.close()
  if status != "completed":
    print(f"\n{status}; the last good checkpoint is step {ckpt.latest_step() or last_good} in "
          f"{ckpt.directory}", flush=True)
  adapter_dir = os.path.join(workdir, "adapter")
  lora_lib.export_peft(state["lora"], lora_cfg, model_config, adapter_dir,
                       base_model_name_or_path=str(config.model.source))
  summary = {"status": status, "step": int(state["step"]), "workdir": workdir, "adapter": adapter_dir}
  if config.sample_prompt and status == "completed":
    after = answer(base, model_config, tokenizer, config.sample_prompt, lora=state["lora"],
                   lora_scale=scale, dtype=dtype, max_new_tokens=config.sample_max_new_tokens)
    print(f"\n[after] {config.sample_prompt}\n{after}\n", flush=True)
    summary["sample_after"] = after
  atomic_write_text(os.path.join(workdir, "summary.json"), json.dumps(summary, indent=2))
  print(f"adapter: {adapter_dir}\nlogs: {os.path.join(workdir, 'logs')} (tensorboard --logdir ...)")
  return summary


def _ckpt_metrics(scalars: dict) -> dict | None:
  return {"eval_loss": scalars["eval_loss"]} if "eval_loss" in scalars else None
