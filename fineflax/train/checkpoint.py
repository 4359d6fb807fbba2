"""Checkpoints with orbax: the train state pytree plus a JSON sidecar (data position, metrics, notes).

Keeps the last `keep_last` steps and the `keep_best` best by `best_metric`. Orbax writes into a temporary
directory and renames it when complete, so a crash or a full disk never damages an existing checkpoint.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp


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
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state: Any, meta: dict, metrics: dict | None = None) -> bool:
    """Saves synchronously; returns False (and logs why) if the write failed, e.g. a full disk.

    A step that is already saved is kept as it is (a stop request right after a periodic save)."""
    if step in self.manager.all_steps():
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
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                             meta=ocp.args.JsonRestore()))
    return out["state"], out["meta"]

  def close(self) -> None:
    self.manager.close()
