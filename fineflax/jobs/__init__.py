"""Jobs picked by name from `config.job`: each module `fineflax.jobs.<name>` has `run(config, workdir)` and
optionally `validate(config)` (checks beyond `fineflax.jobs.resolve.validate_common`)."""
from __future__ import annotations

import importlib

from fineflax.config_checks import ConfigError

JOBS = ("chat", "sft", "rl", "distill", "agent_rl", "apo")


def get_job(name: str):
  if name not in JOBS:
    raise ConfigError(f"config.job={name!r} is not a job; choose one of {', '.join(JOBS)}")
  return importlib.import_module(f"fineflax.jobs.{name}")


def run(config, workdir: str | None):
  return get_job(config.job).run(config, workdir)


def dry_run_report(config) -> str:
  """The resolved config, the device mesh, parameter counts and memory estimate, from model metadata only."""
  from fineflax.models import load_config, memory_estimate
  from fineflax.models.estimate import lora_params
  from fineflax.models.targets import resolve_targets
  get_job(config.job)
  mc = load_config(config.model.source)
  lora = config.get("lora")
  rank = lora.r if lora is not None else 0
  quant = config.model.get("quant", "none")
  data = config.get("data")
  rl = config.get("rl")
  batch = data.batch_size if data is not None else (rl.prompts_per_step * rl.group_size if rl else 1)
  seq = data.max_length if data is not None else (512 + rl.max_new_tokens if rl else 1024)
  est = memory_estimate(mc, dtype=config.model.get("dtype", "bfloat16"), quant=quant, lora_rank=rank,
                        batch=batch, seq_len=seq)
  lines = ["# resolved config", str(config), "# model", f"source: {config.model.source}",
           f"architecture: {mc.model_type}, {mc.num_layers} layers, hidden {mc.hidden_size}, "
           f"heads {mc.num_heads}/{mc.num_kv_heads}, vocab {mc.vocab_size}",
           f"parameters: {mc.num_params():,}"]
  if rank:
    lines.append(f"trainable LoRA parameters (r={rank}): {lora_params(mc, rank, resolve_targets(tuple(lora.targets))):,}")
  lines.append(f"# memory estimate (quant={quant}, batch {batch} x {seq} tokens)")
  lines += [f"{k}: {v:.3f}" for k, v in est.items()]
  return "\n".join(lines)
