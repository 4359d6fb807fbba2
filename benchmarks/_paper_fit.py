"""`benchmarks.paper_scale --fit` (issue 46 item 3): the most prompts a step of a paper recipe whose memory plan
(`fineflax.jobs.memory_plan`, the run's own fit check) fits the visible devices, falling back to smaller model
shapes when even one prompt does not fit at the paper's.

For each shape in order (the paper's, then `FALLBACK_SHAPES`): P from the requested prompts down to 1, the
config of `paper_config(spec)` planned on a (data 1, fsdp n) mesh of the n visible devices; the first P whose
rollout and update phases both fit in `margin` x the device's `bytes_limit` is run. A shape that fits at no P
gets the plan's one-line refusal (`plan_verdict.refusal` at P = 1), kept in the row as `why`.
"""
from __future__ import annotations

FALLBACK_SHAPES = ("Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-1.5B")  # hub names of fineflax.models.hub_shapes
MARGIN = 0.9  # of the device's bytes_limit: room for what the plan does not count (workspace, fragmentation)


def plan_inputs(config, n_devices: int):
  from fineflax.jobs.memory_plan import inputs_from_config
  return inputs_from_config(config, n_devices, 1, n_devices)


def fit_spec(spec: dict, paper_config, n_devices: int, device_bytes: float, margin: float = MARGIN):
  """(spec to run, notes): `spec` with the largest fitting `prompts` and, when the paper's shape fits at no
  P, `model_source` set to the first fallback shape that does; notes: one line per shape that does not fit,
  and the P chosen. (None, notes) when no shape fits."""
  from fineflax.jobs.memory_plan import GIB, fits
  from fineflax.jobs.plan_verdict import refusal
  budget, notes = margin * device_bytes, []
  shapes = (spec.get("model_source") or paper_config(spec).model.source, *FALLBACK_SHAPES)
  for source in shapes:
    for prompts in range(spec["prompts"], 0, -1):
      s = dict(spec, prompts=prompts, model_source=source)
      if fits(plan_inputs(paper_config(s), n_devices), budget):
        notes.append(f"{source}: {prompts} prompts x {spec['samples']} rows fit {n_devices} x "
                     f"{budget / GIB:.1f} GiB ({margin:.0%} of the device) by the plan")
        return s, notes
    one = dict(spec, prompts=1, model_source=source)
    notes.append(f"{source} does not fit {n_devices} devices even at 1 prompt: "
                 f"{refusal(plan_inputs(paper_config(one), n_devices), budget)}")
  return None, notes
