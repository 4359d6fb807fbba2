"""From scored groups to LoRA updates: group advantages, the padded batch, old/ref log-probs, updates.

  A = group_advantages(rewards of the kept groups, K, scale)            (fineflax.rl.advantages)
  old_logp = logp of the completions under the current LoRA (before any update of this step)
  ref_logp = logp under the base with LoRA off (only when beta > 0)
  then `num_iterations` jitted updates of the objective (fineflax.rl.step) on the same batch.
"""
from __future__ import annotations

import jax
import numpy as np

from fineflax.rl import rows as R
from fineflax.rl.advantages import group_advantages
from fineflax.rl.batch import build_rl_batch, pad_ragged, round_up


def update_batch(rows, rewards, keep_groups, *, group_size: int, pad_id: int, max_new_tokens: int,
                 advantage_scale: str, fields: tuple[str, ...]) -> dict:
  """The batch of `fineflax.rl.step` for the kept groups (without old/ref log-probs)."""
  sel = np.flatnonzero(np.repeat(keep_groups, group_size))
  kept = R.take(rows, sel)
  batch = build_rl_batch(kept["prompt"], kept["completion"], kept["loss_mask"], pad_id=pad_id,
                         completion_width=round_up(max_new_tokens, 32))
  batch["advantages"] = np.asarray(group_advantages(np.asarray(rewards)[sel], group_size,
                                                    scale=advantage_scale), np.float32)
  batch["is_off_policy"] = np.asarray(kept["off_policy"], bool)
  if "behaviour_logp" in fields:
    batch["behaviour_logp"] = pad_ragged(kept["behaviour_logp"], batch["completion"].shape[1])
  return batch


def rl_update(state, base, batch, *, step_fn, logp_fn, beta: float, num_iterations: int):
  """(new state, metrics of the last update): old/ref log-probs, then `num_iterations` updates."""
  batch = dict(batch, old_logp=np.asarray(logp_fn(state["lora"], base, batch)[0]))
  if beta:
    batch["ref_logp"] = np.asarray(logp_fn(None, base, batch)[0])
  for _ in range(num_iterations):
    state, metrics = step_fn(state, base, batch)
  return state, {k: float(v) for k, v in jax.device_get(metrics).items()}
