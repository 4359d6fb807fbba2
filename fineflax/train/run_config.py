"""The run's config saved beside its checkpoints, and the check that a resumed run is the same run.

WORKDIR/config.json holds the config of the run that wrote the checkpoints. Resuming with a config that
differs in a field that changes the run (anything but its length, logging and checkpoint cadence) is
refused with the differing fields named, before anything is restored. `resume=False` moves the old
run's outputs to WORKDIR/replaced-<time>/ (nothing is deleted) and starts afresh.
"""
from __future__ import annotations

import fnmatch
import json
import os
import time

from fineflax.io import atomic_write_text

# fields a resumed run may change: its length, evaluation/logging cadence and where and how it runs
# (model.layer_loop: the same arithmetic as a scan or an unrolled loop; absent in configs older than it)
RESUMABLE_CHANGES = ("num_steps", "optimizer.num_steps", "eval_every", "eval_batch_size", "log_every",
                     "checkpoint.*", "resume", "verbose", "sample_prompt", "sample_max_new_tokens",
                     "mesh.*", "distributed.*", "model.layer_loop", "rl.dense_rollouts", "rl.decode_impl")
# keys added to the configs after runs were saved without them: {key: the value their absence meant}
ADDED_KEYS = {"train.params": "lora", "train.master_dtype": "bfloat16", "train.micro_batch_tokens": 0,
              "train.moment_dtype": "float32", "train.loss_head": "chunked",
              "rl.mini_batch_size": 0, "rl.micro_batch_tokens": 0, "rl.skip_grad_bound": 0.0,
              "rl.decode_impl": "auto"}
RUN_OUTPUTS = ("checkpoints", "checkpoints.unreadable", "logs", "history.json", "summary.json", "adapter",
               "model", "config.json")


class ConfigChanged(ValueError):
  """A workdir's checkpoints belong to a run with another config."""


class WorkdirError(ValueError):
  """A workdir that cannot be a run's folder (it, or a folder above it, is a file)."""


def check_workdir(workdir: str) -> None:
  """Raise WorkdirError (one line) unless `workdir` is a folder or can be made one."""
  path = os.path.abspath(workdir)
  while path and not os.path.exists(path):
    path = os.path.dirname(path)
  if os.path.exists(path) and not os.path.isdir(path):
    where = "is a file" if path == os.path.abspath(workdir) else f"is under {path}, which is a file"
    raise WorkdirError(f"workdir {workdir} {where}; pass --workdir a folder (new or an earlier run's)")


def flatten(d: dict, prefix: str = "") -> dict:
  """{"a": {"b": 1}} -> {"a.b": 1}; tuples become lists (as JSON stores them)."""
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(flatten(v, key + "."))
    else:
      out[key] = list(v) if isinstance(v, tuple) else v
  return out


def saved_form(config) -> dict:
  """The dict saved as WORKDIR/config.json: `config` with the fields whose "auto" is resolved on the
  machine (model.dtype: `fineflax.models.dtype`) as resolved, so a run started in float32 on a CPU is
  not resumed in bfloat16 on a GPU, and a run saved with "bfloat16" resumes under "auto" on a GPU."""
  from fineflax.models.dtype import DTYPE_CHOICES, resolve_dtype_name
  out = config.to_dict()
  if isinstance(out.get("model"), dict) and out["model"].get("dtype") in DTYPE_CHOICES:
    out["model"]["dtype"] = resolve_dtype_name(out["model"]["dtype"])
  return out


def config_diff(saved: dict, current: dict) -> list[tuple[str, object, object]]:
  """(key, saved value, current value) of every flattened key that differs and may not change."""
  a, b = flatten(saved), flatten(json.loads(json.dumps(current, default=str)))
  a, b = {**ADDED_KEYS, **a}, {**ADDED_KEYS, **b}
  keys = sorted(set(a) | set(b))
  allowed = lambda k: any(fnmatch.fnmatchcase(k, p) for p in RESUMABLE_CHANGES)
  return [(k, a.get(k, "<absent>"), b.get(k, "<absent>")) for k in keys
          if not allowed(k) and a.get(k, "<absent>") != b.get(k, "<absent>")]


def check_resumable(config, workdir: str, write: bool = True) -> None:
  """Raise `ConfigChanged` when WORKDIR holds checkpoints of a run with a different config; with
  `config.resume=False` move that run's outputs aside instead. Then save the current config.
  write=False only checks (the processes other than 0 of a multi-process run)."""
  path = os.path.join(workdir, "config.json")
  current = saved_form(config)
  has_ckpt = os.path.isdir(os.path.join(workdir, "checkpoints")) and os.listdir(
      os.path.join(workdir, "checkpoints"))
  if not write and not (has_ckpt and config.get("resume", True)):
    return
  if has_ckpt and not config.get("resume", True):
    aside = os.path.join(workdir, time.strftime("replaced-%Y%m%d-%H%M%S"))
    os.makedirs(aside)
    for name in RUN_OUTPUTS:
      if os.path.exists(os.path.join(workdir, name)):
        os.rename(os.path.join(workdir, name), os.path.join(aside, name))
    print(f"resume=false: the previous run's outputs moved to {aside}", flush=True)
  elif has_ckpt and os.path.exists(path):
    with open(path) as f:
      diff = config_diff(json.load(f), current)
    if diff:
      shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diff[:8])
      raise ConfigChanged(
          f"{workdir} holds checkpoints of a run with another config ({len(diff)} field(s) differ: {shown}). "
          f"Use a new --workdir, or --config.resume=false to move that run aside and start afresh.")
  if not write:
    return
  atomic_write_text(path, json.dumps(current, indent=1, default=str))
