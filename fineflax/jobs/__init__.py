"""Jobs picked by name from `config.job`: each module `fineflax.jobs.<name>` has `run(config, workdir)`."""
from __future__ import annotations

import importlib

JOBS = ("chat", "sft", "grpo", "search_r1", "distill")


def get_job(name: str):
  if name not in JOBS:
    raise ValueError(f"config.job={name!r} is not a job; choose one of {', '.join(JOBS)}")
  return importlib.import_module(f"fineflax.jobs.{name}")


def run(config, workdir: str | None) -> None:
  get_job(config.job).run(config, workdir)


def dry_run_report(config) -> str:
  """The resolved config, parameter counts and memory estimate, from model metadata only."""
  from fineflax.models import load_config, memory_estimate
  get_job(config.job)
  mc = load_config(config.model.source)
  lora = config.get("lora")
  rank = lora.r if lora is not None and lora.get("enabled", True) else 0
  quant = config.model.get("quant", "none")
  data = config.get("data")
  est = memory_estimate(mc, dtype=config.model.get("dtype", "bfloat16"), quant=quant, lora_rank=rank,
                        batch=data.batch_size if data is not None else 1,
                        seq_len=data.max_length if data is not None else config.get("max_len", 1024))
  from fineflax.models.estimate import lora_params
  lines = ["# resolved config", str(config), "# model", f"source: {config.model.source}",
           f"architecture: {mc.model_type}, {mc.num_layers} layers, hidden {mc.hidden_size}, "
           f"heads {mc.num_heads}/{mc.num_kv_heads}, vocab {mc.vocab_size}",
           f"parameters: {mc.num_params():,}"]
  if rank:
    lines.append(f"trainable LoRA parameters (r={rank}): {lora_params(mc, rank, tuple(lora.targets)):,}")
  lines.append(f"# memory estimate (quant={quant})")
  lines += [f"{k}: {v:.3f}" for k, v in est.items()]
  return "\n".join(lines)
