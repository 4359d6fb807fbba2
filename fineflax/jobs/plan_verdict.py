"""The verdict on a memory plan (`fineflax.jobs.memory_plan`): its report per phase and term, and for a plan that
does not fit the one-line refusal naming the knobs (with values) that make it fit."""
from __future__ import annotations

import dataclasses

from fineflax.config_checks import ConfigError
from fineflax.engine.tensor_parallel import check_tp
from fineflax.jobs.memory_plan import GIB, PlanInputs, micro_batch_tokens, phases
from fineflax.models.config import ModelConfig


def report_lines(i: PlanInputs, device_bytes: float | None) -> list[str]:
  """The plan per phase and term in GiB, and the verdict when the device memory is known."""
  lines = [f"# memory plan per device ({i.n_devices} devices, fsdp={i.fsdp}, model={i.tp}, params={i.params}, "
           f"remat={i.remat}, {micro_batch_tokens(i)} tokens per update micro-batch)"]
  for name, terms in phases(i).items():
    lines.append(f"{name} phase: {sum(terms.values()) / GIB:.2f} GiB")
    lines += [f"  {k}: {v / GIB:.3f}" for k, v in terms.items()]
  if device_bytes is None:
    lines.append("verdict: device memory unknown (pass --device_memory_gb to check the fit)")
  else:
    problem = refusal(i, device_bytes)
    lines.append(f"verdict: fits in {device_bytes / GIB:.1f} GiB per device" if problem is None
                 else f"verdict: does not fit: {problem}")
  return lines


def _phase_fits(i: PlanInputs, phase: str, device_bytes: float) -> bool:
  return sum(phases(i).get(phase, {}).values()) <= device_bytes


def _knob_for(i: PlanInputs, phase: str, device_bytes: float):
  """(key, value, inputs with it) of the first knob that makes `phase` fit, in the order: model.remat=full,
  the largest micro-batch token budget (a power of two, at least one row), the smallest mesh.model (rollout
  phase; one that splits the heads, kv heads and intermediate size), the smallest mesh.fsdp (a divisor of
  the devices), the most rollout prompts, train.params=lora; None when none does."""
  rep = lambda **kw: dataclasses.replace(i, **kw)
  ok = lambda j: _phase_fits(j, phase, device_bytes)
  tries = []
  if i.remat == "none":
    tries.append([("model.remat", "full", rep(remat="full"))])
  if phase == "update":
    tries.append([(i.micro_key, t, rep(micro_batch_tokens=t)) for t in (2 ** k for k in range(20, 9, -1))
                  if i.seq <= t < micro_batch_tokens(i)])
  if phase == "rollout":
    tries.append([("mesh.model", t, rep(tp=t)) for t in range(i.tp + 1, i.n_devices + 1)
                  if i.n_devices % t == 0 and tp_divides(i.model, t)])
  tries.append([("mesh.fsdp", f, rep(fsdp=f)) for f in range(i.fsdp + 1, i.n_devices + 1) if i.n_devices % f == 0])
  if phase == "rollout":
    tries.append([("rl.prompts_per_step", p, rep(prompts=p)) for p in range(i.prompts - 1, 0, -1)])
  if i.params == "full":
    tries.append([("train.params", "lora", rep(params="lora"))])
  return next((t for options in tries for t in options if ok(t[2])), None)


def tp_divides(c: ModelConfig, t: int) -> bool:
  """Whether tensor parallelism over t devices splits the model (`engine.tensor_parallel.check_tp`)."""
  try:
    check_tp(c, t)
  except ValueError:
    return False
  return True


def refusal(i: PlanInputs, device_bytes: float) -> str | None:
  """None when both phases fit; else one line: the phase over (the larger), its total and largest term, and the
  knobs (with values) that make the plan fit, chosen phase by phase (`_knob_for`)."""
  over = {k: v for k, v in phases(i).items() if sum(v.values()) > device_bytes}
  if not over:
    return None
  name, terms = max(over.items(), key=lambda kv: sum(kv[1].values()))
  top = max(terms, key=terms.get)
  head = (f"the {name} phase needs {sum(terms.values()) / GIB:.1f} GiB per device of "
          f"{device_bytes / GIB:.1f} (largest: {top} {terms[top] / GIB:.1f} GiB); ")
  knobs, j = [], i
  for _ in range(4):
    left = [k for k, v in phases(j).items() if sum(v.values()) > device_bytes]
    if not left:
      return head + "set " + " and ".join(f"config.{k}={v}" for k, v in knobs)
    found = _knob_for(j, left[0], device_bytes)
    if found is None:
      break
    knobs.append(found[:2])
    j = found[2]
  return head + "no setting of model.remat, the micro-batch tokens, mesh.model, mesh.fsdp or the rollout prompts fits: use " \
                "more or larger devices"


def check_plan(i: PlanInputs | None, device_bytes: float | None) -> None:
  """ConfigError (one line, exit 2) when the plan does not fit; nothing when it fits or is unknown."""
  if i is None or device_bytes is None:
    return
  problem = refusal(i, device_bytes)
  if problem is not None:
    raise ConfigError(f"plan does not fit: {problem}")
