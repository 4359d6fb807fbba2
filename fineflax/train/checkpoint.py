"""Checkpoints with orbax: the train state pytree plus a JSON sidecar (data position, metrics, notes).

Keeps the last `keep_last` steps and the `keep_best` best by `best_metric`. Orbax writes into a temporary
directory and renames it when complete, so a crash or a full disk never damages an existing checkpoint.

A step damaged afterwards (a truncated file, garbage JSON) does not block a resume: `restore_newest` falls
back to the newest step that restores, printing one line per step it skipped and why; it deletes nothing.
Saving that step again later moves the damaged one aside first (to `<directory>.unreadable/<step>`), so
the new save is not mistaken for it and nothing is lost.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

from fineflax.train.distributed import barrier, is_writer
from fineflax.train.state import LEGACY_KEYS


class CheckpointUnreadable(ValueError):
  """No saved step of a checkpoint directory restores; the message names the directory and each error."""


def _one_line(e: BaseException, limit: int = 500) -> str:
  """The error on one line, without tensorstore's spec dumps, at most `limit` characters."""
  text = " ".join(str(e).split(" [tensorstore_spec")[0].split())
  return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


@contextlib.contextmanager
def _quiet_failed_reads():
  """Mutes asyncio's 'Task exception was never retrieved' dumps of orbax's failed reads (one line says
  why instead)."""
  logger = logging.getLogger("asyncio")
  disabled, logger.disabled = logger.disabled, True
  try:
    yield
  finally:
    gc.collect()  # the dumps come when the failed tasks are collected
    logger.disabled = disabled


def latest_checkpoint_step(directory: str) -> int | None:
  """The latest complete checkpoint step in `directory` (None: none, or no such folder); creates nothing."""
  if not os.path.isdir(directory) or not os.listdir(directory):
    return None
  ckpt = Checkpointer(directory)
  try:
    return ckpt.latest_step()
  finally:
    ckpt.close()


class Checkpointer:
  """save(step, state, meta, metrics) / restore(abstract_state) over an orbax CheckpointManager."""

  def __init__(self, directory: str, keep_last: int = 2, keep_best: int = 1,
               best_metric: str = "eval_loss", best_mode: str = "min"):
    self.directory = os.path.abspath(directory)
    policies = [pp.LatestN(keep_last)]
    if keep_best and best_metric:
      policies.append(pp.BestN(get_metric_fn=lambda m: m[best_metric], reverse=best_mode == "min",
                               n=keep_best, keep_checkpoints_without_metrics=False))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=pp.AnyPreservationPolicy(policies), enable_async_checkpointing=False,
        create=True)
    self.manager = ocp.CheckpointManager(  # handlers named up front: item_metadata reads a fresh manager
        self.directory, options=options,
        item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()})
    self.unreadable: set[int] = set()  # steps restore_newest skipped (still on disk)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state: Any, meta: dict, metrics: dict | None = None) -> bool:
    """Saves synchronously; returns False (and logs why) if the write failed, e.g. a full disk.

    A step that is already saved is kept as it is (a stop request right after a periodic save), unless
    `restore_newest` found it unreadable: then it is moved aside first (see module docstring)."""
    if step in self.unreadable:
      self._move_aside(step)
    elif step in self.manager.all_steps():
      return True
    try:
      self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                      meta=ocp.args.JsonSave(meta)),
                        metrics=metrics, force=True)
      self.manager.wait_until_finished()
      return True
    except OSError as e:
      logging.error("checkpoint at step %d failed (%s); the last good checkpoint is step %s in %s",
                    step, e, self.latest_step(), self.directory)
      return False

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict] | None:
    """(state, meta) of `step` (default: latest), shaped like `abstract_state`; None if there is none."""
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    renamed = self._legacy_names(step, abstract_state)
    if renamed:  # a checkpoint older than a state key's rename: restore it under its old name
      abstract_state = {renamed.get(k, k): v for k, v in abstract_state.items()}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                             meta=ocp.args.JsonRestore()))
    state = out["state"]
    if renamed:
      back = {old: new for new, old in renamed.items()}
      state = {back.get(k, k): v for k, v in state.items()}
    return state, out["meta"]

  def _legacy_names(self, step: int, abstract_state: Any) -> dict[str, str]:
    """{new key: old key} for the keys of a dict state that `step` saved under their old names
    (`fineflax.train.state.LEGACY_KEYS`, e.g. "lora" before "params"); {} for a current checkpoint."""
    if not isinstance(abstract_state, dict):
      return {}
    try:
      saved = set(self.manager.item_metadata(step)["state"].keys())
    except Exception:  # noqa: BLE001 - no readable metadata: restore as is (and fail there, named)
      return {}
    return {new: old for old, new in LEGACY_KEYS.items()
            if new in abstract_state and new not in saved and old in saved}

  def restore_newest(self, abstract_state: Any) -> tuple[int, Any, dict] | None:
    """(step, state, meta) of the newest step that restores; None if nothing is saved.

    Each newer step that fails to restore is skipped with one printed line (step, directory, error) and
    left on disk; if no step restores, raises `CheckpointUnreadable` naming the directory."""
    failures = []
    for step in sorted(self.all_steps(), reverse=True):
      try:
        with _quiet_failed_reads():
          state, meta = self.restore(abstract_state, step)
      except Exception as e:  # noqa: BLE001 - any damage (orbax/tensorstore/JSON errors): try an older step
        failures.append(f"step {step}: {_one_line(e)}")
        self.unreadable.add(step)
        print(f"checkpoint step {step} in {self.directory} does not restore ({_one_line(e)}); "
              f"skipped it (left on disk)", flush=True)
        continue
      return step, state, meta
    if failures:
      raise CheckpointUnreadable(f"no checkpoint in {self.directory} restores ({'; '.join(failures)}); "
                                 f"move that folder aside (or use another workdir) to start over")
    return None

  def _move_aside(self, step: int) -> None:
    """Renames the unreadable step's folder to <directory>.unreadable/<step>[-<time>] (process 0)."""
    if is_writer() and os.path.isdir(os.path.join(self.directory, str(step))):
      dest = os.path.join(self.directory + ".unreadable", str(step))
      if os.path.exists(dest):
        dest += f"-{int(time.time())}"
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      os.rename(os.path.join(self.directory, str(step)), dest)
      print(f"moved the unreadable checkpoint step {step} to {dest} before saving step {step} again", flush=True)
    barrier(f"fineflax_checkpoint_moved_{step}")
    self.manager.reload()
    self.unreadable.discard(step)

  def close(self) -> None:
    self.manager.close()
