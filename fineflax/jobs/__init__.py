"""Jobs picked by name from `config.job`: each module `fineflax.jobs.<name>` has `run(config, workdir)` and
optionally `validate(config)` (its checks beyond `fineflax.jobs.resolve.validate_common`, part of the one
pass `fineflax.jobs.resolve.validate` that launch.py and each job's `run` make before weights load)."""
from __future__ import annotations

import importlib
import math

from fineflax.config_checks import ConfigError

JOBS = ("chat", "sft", "rl", "distill", "agent_rl", "apo")


def get_job(name: str):
  if name not in JOBS:
    raise ConfigError(f"config.job={name!r} is not a job; choose one of {', '.join(JOBS)}")
  return importlib.import_module(f"fineflax.jobs.{name}")


def run(config, workdir: str | None, device_memory_gb: float | None = None):
  """The job's run, after `check_fit`: a plan that cannot fit the devices is refused before any weight loads."""
  check_fit(config, device_memory_gb)
  return get_job(config.job).run(config, workdir)


def check_fit(config, device_memory_gb: float | None = None) -> None:
  """ConfigError naming the knob to change when the run's memory plan (`fineflax.jobs.memory_plan`) exceeds the
  visible devices' memory (or `device_memory_gb` each); nothing where that memory is unknown (CPU)."""
  from fineflax.jobs.plan_verdict import check_plan
  if device_bytes_of(device_memory_gb=device_memory_gb) is None:  # unknown (CPU): nothing to check, and the
    return  # job's own checks (data, workdir, resume) come before anything reads the model's files
  inputs, device_bytes, _ = plan_for(config, device_memory_gb=device_memory_gb)
  check_plan(inputs, device_bytes)


def device_bytes_of(devices: int | None = None, device_memory_gb: float | None = None) -> float | None:
  """Memory of one device of the plan: `device_memory_gb` when given, unknown (None) when planning for
  `devices` other devices, else the first visible device's reported limit (None on CPU)."""
  import jax
  from fineflax.jobs.memory_plan import GIB
  if device_memory_gb:
    return float(device_memory_gb) * GIB
  if devices:
    return None
  stats = jax.devices()[0].memory_stats() or {}
  return float(stats["bytes_limit"]) if "bytes_limit" in stats else None


def plan_for(config, devices: int | None = None, device_memory_gb: float | None = None):
  """(PlanInputs or None, device bytes or None, mesh line) of `config` on `devices` planned devices (default:
  the visible ones) of `device_memory_gb` each (default: the first visible device's limit when it reports
  one, and unknown when planning for other devices)."""
  import jax
  from fineflax.engine.tensor_parallel import check_tp
  from fineflax.jobs.memory_plan import inputs_from_config
  from fineflax.mesh import mesh_shape
  n = int(devices) if devices else jax.device_count()
  mesh_cfg = config.get("mesh") or {"data": -1, "fsdp": 1}
  try:
    data, fsdp = mesh_shape(mesh_cfg["data"], mesh_cfg["fsdp"], n)
  except ValueError as e:
    raise ConfigError(f"config.mesh (data={mesh_cfg['data']}, fsdp={mesh_cfg['fsdp']}): {e}") from None
  model = int(mesh_cfg.get("model", 1))
  if model < 1 or n % model:
    raise ConfigError(f"config.mesh.model={model}: {n} devices are not divisible by it")
  device_bytes = device_bytes_of(devices, device_memory_gb)
  dev = jax.devices()[0]
  where = (f"{n} planned device(s)" if devices else f"{n} {dev.platform} device(s) "
           f"({getattr(dev, 'device_kind', dev.platform)}; {jax.process_count()} process(es))")
  line = f"# mesh: data={data} x fsdp={fsdp} over {where}" + (f"; rollouts tensor-parallel over model={model}"
                                                              f" in {n // model} group(s)" if model > 1 else "")
  inputs = inputs_from_config(config, n, data, fsdp, model)
  try:
    if inputs is not None:
      check_tp(inputs.model, model)
  except ValueError as e:  # worded as the run's own refusal (`fineflax.rl.learner.Learner`)
    raise ConfigError(f"config.mesh.model={model}: {e}") from None
  return inputs, device_bytes, line


def named_devices(config, devices: int | None = None) -> tuple[int | None, str]:
  """(devices a dry run plans for, a note line or ""): `devices` when given; None (the visible ones) when
  config.mesh fits them; else the fewest devices config.mesh names, lcm((data or 1) x fsdp, model), with a
  line saying so and how to plan for another count (a paper config's fsdp=8 dry-run on a one-device machine)."""
  import jax
  from fineflax.mesh import mesh_shape
  if devices:
    return devices, ""
  n = jax.device_count()
  m = config.get("mesh") or {"data": -1, "fsdp": 1}
  data, fsdp, model = int(m["data"]), int(m["fsdp"]), int(m.get("model", 1))
  try:
    mesh_shape(data, fsdp, n)
    if model >= 1 and n % model == 0:
      return None, ""
  except ValueError:
    pass
  named = math.lcm(max(data, 1) * fsdp, max(model, 1))
  return named, (f"# planning for the {named} devices config.mesh names (data={data}, fsdp={fsdp}, model={model}); "
                 f"{n} visible here: pass --devices N to plan for another count")


def dry_run_report(config, devices: int | None = None, device_memory_gb: float | None = None) -> str:
  """The resolved config, the device mesh, parameter counts and one memory estimate, from model metadata
  only: for RL and SFT jobs the per-device plan of the rollout and update phases (`fineflax.jobs.memory_plan`,
  in the job's mode: full or LoRA, mesh, micro-batches) on `devices` of `device_memory_gb` (default: the
  visible ones, or the devices config.mesh names when it does not fit them: `named_devices`) with one verdict;
  for other jobs the rough whole-model estimate (`fineflax.models.memory_estimate`). Raises ConfigError naming
  the knob to change when the plan does not fit (after the report is built; `launch.py` prints it first)."""
  import jax
  from fineflax.models import load_config, memory_estimate
  from fineflax.models.dtype import resolve_dtype_name
  from fineflax.models.estimate import lora_params
  from fineflax.models.targets import resolve_targets
  from fineflax.train.trainable import is_full, moment_dtype
  get_job(config.job)
  devices, note = named_devices(config, devices)
  mc = load_config(config.model.source)
  lora = config.get("lora")
  rank = lora.r if lora is not None else 0
  quant = config.model.get("quant", "none")
  data = config.get("data")
  rl = config.get("rl")
  batch = data.batch_size if data is not None else (rl.prompts_per_step * rl.group_size if rl else 1)
  seq = data.max_length if data is not None else (512 + rl.max_new_tokens if rl else 1024)
  dtype = resolve_dtype_name(config.model.get("dtype", "auto"))
  est = memory_estimate(mc, dtype=dtype, quant=quant, lora_rank=rank, batch=batch, seq_len=seq)
  lines = ["# resolved config", str(config), "# model", f"source: {config.model.source}",
           f"compute dtype: {dtype} (config.model.dtype={config.model.get('dtype', 'auto')!r} on "
           f"{jax.default_backend()})",
           f"architecture: {mc.model_type}, {mc.num_layers} layers, hidden {mc.hidden_size}, "
           f"heads {mc.num_heads}/{mc.num_kv_heads}, vocab {mc.vocab_size}",
           f"parameters: {mc.num_params():,}"]
  if is_full(config):
    lines.append(f"trainable parameters (train.params=full): {mc.num_params():,} (master "
                 f"{config.train.get('master_dtype', 'bfloat16')}, AdamW moments {moment_dtype(config)})")
  elif rank:
    lines.append(f"trainable LoRA parameters (r={rank}): {lora_params(mc, rank, resolve_targets(tuple(lora.targets))):,}")
  from fineflax.jobs.plan_verdict import check_plan, report_lines
  inputs, device_bytes, mesh_line = plan_for(config, devices, device_memory_gb)
  if inputs is not None:  # the one estimate of an RL or SFT job: its plan
    lines += [note] * bool(note) + [mesh_line, *report_lines(inputs, device_bytes)]
  else:
    lines.append(f"# memory estimate (quant={quant}, batch {batch} x {seq} tokens)")
    lines += [f"{k}: {v:.3f}" for k, v in est.items()]
    if config.get("mesh") is not None:
      lines += mesh_report(config.mesh, est)
  report = "\n".join(lines)
  try:
    check_plan(inputs, device_bytes)
  except ConfigError as e:
    raise PlanRefused(str(e), report) from None
  return report


class PlanRefused(ConfigError):
  """A dry run whose plan does not fit: the one-line reason, and the whole report (`.report`) to print first."""

  def __init__(self, message: str, report: str):
    super().__init__(message)
    self.report = report


def per_device_gib(est: dict, data: int, fsdp: int) -> dict:
  """GiB per device on a (data, fsdp) mesh: frozen weights / fsdp, LoRA + optimizer replicated, KV cache
  and activations / (data * fsdp) (the batch is split over every device)."""
  out = {"weights_gib": est["weights_gib"] / fsdp, "lora_and_optimizer_gib": est["lora_and_optimizer_gib"],
         "kv_cache_gib": est["kv_cache_gib"] / (data * fsdp),
         "activation_checkpoints_gib": est["activation_checkpoints_gib"] / (data * fsdp)}
  return dict(out, total_gib=sum(out.values()))


def mesh_report(mesh_cfg, est: dict) -> list[str]:
  """The mesh `fineflax.mesh.make_mesh` would build on the visible devices, and the estimate per
  device on it."""
  import jax
  from fineflax.mesh import make_mesh
  try:
    mesh = make_mesh(mesh_cfg.data, mesh_cfg.fsdp)
  except ValueError as e:
    raise ConfigError(f"config.mesh (data={mesh_cfg.data}, fsdp={mesh_cfg.fsdp}): {e}") from None
  data, fsdp = mesh.shape["data"], mesh.shape["fsdp"]
  dev = jax.devices()[0]
  lines = [f"# mesh: data={data} x fsdp={fsdp} over {mesh.devices.size} {dev.platform} device(s) "
           f"({getattr(dev, 'device_kind', dev.platform)}; {jax.process_count()} process(es))",
           "# memory estimate per device"]
  return lines + [f"{k}: {v:.3f}" for k, v in per_device_gib(est, data, fsdp).items()]
