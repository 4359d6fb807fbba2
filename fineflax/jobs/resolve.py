"""Resolving a run's config: the file and presets (`configs/X.py:a,b`), `--config.a.b=v` overrides parsed by
ml_collections exactly as launch.py does, and validation of every bounded field before any work.

A user mistake raises `ConfigError` with one line naming the key, the value and what is allowed (or
the closest valid keys).
"""
from __future__ import annotations

import difflib
import os
import pathlib
import re
from typing import Sequence

from absl import flags
from ml_collections import config_flags

from fineflax.config_checks import ConfigError, in_range, one_of, positive_int, require
from fineflax.train.run_config import flatten


def load_config(spec: str, overrides: Sequence[str] = ()):
  """The locked ConfigDict of `spec` ("configs/x.py[:presets]") with overrides "a.b=v" (or "--config.a.b=v")."""
  argv = ["resolve", f"--config={spec}", *[o if o.startswith("--") else f"--config.{o}" for o in overrides]]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "config file", flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  parse_config_flags(fv, argv)
  return fv.config


CHECKOUT = pathlib.Path(__file__).resolve().parents[2]  # the folder of launch.py and configs/ (editable install)


def resolve_config_file(spec: str) -> str:
  """`spec` ("path[:presets]") with its path as given when that file exists (relative to the working
  directory), else the same relative path in this checkout (`CHECKOUT`) when it is there, so the README's
  `--config configs/quickstart.py` works from any folder. Otherwise ConfigError: one line naming the places
  looked in and the closest config files."""
  path, sep, presets = spec.partition(":")
  if os.path.isfile(path):
    return spec
  tried = [os.path.abspath(path)]
  if not os.path.isabs(path):
    in_checkout = CHECKOUT / path
    if in_checkout.is_file():
      return str(in_checkout) + sep + presets
    tried = list(dict.fromkeys([*tried, str(in_checkout)]))
  close = []
  for where in dict.fromkeys(os.path.dirname(t) for t in tried):
    names = [n for n in os.listdir(where) if n.endswith(".py")] if os.path.isdir(where) else []
    close += [os.path.join(os.path.dirname(path), n)
              for n in difflib.get_close_matches(os.path.basename(path), names, n=3, cutoff=0.75)]
  hint = f"; closest: {', '.join(dict.fromkeys(close))}" if close else ""
  raise ConfigError(f"--config={spec}: no such config file (looked for {' and '.join(tried)}){hint}")


def parse_config_flags(fv, argv: Sequence[str]) -> list[str]:
  """fv(argv) with ml_collections' config flag, the config file found by `resolve_config_file`; its errors
  become one-line `ConfigError`s."""
  spec = config_spec(argv)
  if spec:
    argv = with_config_spec(argv, resolve_config_file(spec))
  try:
    rest = fv(list(argv))
    getattr(fv["config"].value, "job", None)  # a config file that failed to load raises OSError here
    return rest
  except (flags.UnrecognizedFlagError, AttributeError, KeyError):
    raise ConfigError(unknown_key_message(argv, spec)) from None
  except (flags.Error, OSError) as e:
    message = _last_line(str(e))
    bad = re.match(r"flag --config\.([\w.]+)=(.*?): (.*)", str(e))
    if bad:
      message = f"config.{bad.group(1)}={bad.group(2)!r}: {_last_line(bad.group(3))}"
    elif "--config" in str(e).split(":")[0] or not spec:
      message = f"--config={spec}: {message}"
    raise ConfigError(message) from None


def _config_position(argv: Sequence[str]) -> tuple[int, bool] | None:
  """(index, whether it is the "--config=X" form) of the --config argument of argv; None when absent."""
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      return i, True
    if a == "--config" and i + 1 < len(argv):
      return i, False
  return None


def config_spec(argv: Sequence[str]) -> str:
  """The value of --config in argv ("--config=X" or "--config X"); "" when absent."""
  pos = _config_position(argv)
  if pos is None:
    return ""
  i, equals = pos
  return argv[i].split("=", 1)[1] if equals else argv[i + 1]


def with_config_spec(argv: Sequence[str], spec: str) -> list[str]:
  """argv with the value of its --config argument replaced by `spec`."""
  out = list(argv)
  i, equals = _config_position(out)
  if equals:
    out[i] = f"--config={spec}"
  else:
    out[i + 1] = spec
  return out


def unknown_key_message(argv: Sequence[str], spec: str) -> str:
  """Names the first override key the config does not have, with the closest valid keys."""
  base = load_config(spec)
  known = sorted(flatten(base.to_dict()))
  keys = [a.split("=", 1)[0].removeprefix("--config.") for a in argv if a.startswith("--config.")]
  key = next((k for k in keys if k not in known and not any(x.startswith(k + ".") for x in known)),
             keys[0] if keys else "?")
  close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
  hint = f"; closest: {', '.join(close)}" if close else ""
  return f"unknown config key config.{key} in {spec.split(':')[0]}{hint}"


def _last_line(message: str) -> str:
  lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
  tail = lines[-1] if lines else message
  return re.sub(r"^[A-Za-z_.]+(Error|Exception): ", "", tail)


def _is_remat(value: str, remat_policy) -> bool:
  try:
    remat_policy(value)
  except ValueError:
    return False
  return True


def validate_common(config) -> None:
  """Bounded fields every job shares (model, LoRA, what is trained, optimizer, checkpoints, cadence)."""
  from fineflax.models.dtype import DTYPE_CHOICES
  from fineflax.models.decoder import ATTENTION_IMPLS, LINEAR_NAMES
  from fineflax.models.remat import REMAT_NAMES, REMAT_POLICIES, remat_policy
  from fineflax.models.layer_loop import LAYER_LOOP_CHOICES
  from fineflax.models.targets import resolve_targets
  one_of(config, "model.dtype", DTYPE_CHOICES)
  one_of(config, "model.quant", ("none", "nf4", "int8"))
  require(config, "model.remat", lambda v: isinstance(v, str) and _is_remat(v, remat_policy),
          f"choose one of {', '.join(map(repr, REMAT_POLICIES))} or 'save:NAME,...' of {', '.join(REMAT_NAMES)}")
  one_of(config, "model.attention", ATTENTION_IMPLS)
  if "layer_loop" in config.model:
    one_of(config, "model.layer_loop", LAYER_LOOP_CHOICES)
  positive_int(config, "model.logits_chunk")
  for key in ("lora.targets", "model.quant_targets"):
    require(config, key, lambda v: bool(resolve_targets(tuple(v))),
            f"linear names ({', '.join(LINEAR_NAMES)}), HF names (q_proj ...) or all-linear")
  positive_int(config, "lora.r")
  in_range(config, "lora.alpha", 0.0, float("inf"), lo_open=True)
  in_range(config, "lora.dropout", 0.0, 1.0, hi_open=True)
  for key in ("optimizer.num_steps", "eval_every", "log_every", "eval_batch_size", "checkpoint.every",
              "checkpoint.keep_last"):
    positive_int(config, key)
  in_range(config, "optimizer.learning_rate", 0.0, float("inf"), lo_open=True)
  require(config, "optimizer.warmup_steps", lambda v: int(v) == v and v >= 0, "must be an integer >= 0")
  in_range(config, "optimizer.end_lr_ratio", 0.0, 1.0)
  in_range(config, "optimizer.weight_decay", 0.0, float("inf"))
  in_range(config, "optimizer.b1", 0.0, 1.0, hi_open=True)
  in_range(config, "optimizer.b2", 0.0, 1.0, hi_open=True)
  in_range(config, "optimizer.grad_clip", 0.0, float("inf"))
  require(config, "checkpoint.keep_best", lambda v: int(v) == v and v >= 0, "must be an integer >= 0")
  from fineflax.train import trainable
  trainable.validate(config)  # config.train: params, master_dtype; full needs model.quant=none


def validate(config):
  """The one validation pass of a run, before any weight loads (launch.py, and every job's `run`):
  the job name, the fields every job shares (`validate_common`), then the job's own `validate(config)`
  (an RL job: `fineflax.rl.config.RLConfig`, the environment's `Env.validate`, the reward names).
  Raises ConfigError (one line) on the first bad field; returns what the job's validate returns (an RL
  job: its RLConfig), else None."""
  from fineflax.jobs import get_job
  job = get_job(config.job)
  validate_common(config)
  return job.validate(config) if hasattr(job, "validate") else None
