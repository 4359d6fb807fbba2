"""From scored groups to updates of the trainable params (LoRA or full): group advantages, the padded
batch, old/ref log-probs, updates.

  A = group_advantages(rewards of the kept groups, K, scale)            (fineflax.rl.advantages)
  old_logp = logp of the completions under the current params (before any update of this step); when the
             batch gets exactly one optimizer step (`reuses_current_logp`) the step reads its own logp
             under stop_gradient instead (`fineflax.rl.step.rl_loss(on_policy=True)`), one forward fewer
  ref_logp = logp under the frozen reference (only when beta > 0): the base with LoRA off, or in full
             training (`fineflax.train.trainable`) a frozen copy of the initial parameters
  then `num_iterations` jitted updates of the objective (fineflax.rl.step) on the same batch.

On a device mesh (`fineflax.mesh`) the batch rows are split over every device (`shard_update_batch`)
and the train state is placed by `fineflax.train.trainable` (LoRA replicated, full params split over
fsdp): the jitted functions compute the same global sums as on one device. Advantages are computed on the host over the whole batch before it is split, so a group may
straddle two shards without changing them.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fineflax.rl import rows as R
from fineflax.rl.advantages import group_advantages
from fineflax.mesh import batch_sharding, put
from fineflax.rl.batch import build_rl_batch, pad_ragged, pad_rows, round_up


def update_batch(rows, rewards, keep_groups, *, group_size: int, pad_id: int, max_new_tokens: int,
                 advantage_scale: str, fields: tuple[str, ...]) -> dict:
  """The batch of `fineflax.rl.step` for the kept groups (without old/ref log-probs), with every row's
  `behaviour_logp` (`behaviour_logp`: the mismatch metrics and importance weights). An objective whose
  fields hold "rewards" (PPO) gets the raw rewards [B] and its advantages later from its critic (zeros
  here: `fineflax.rl.ppo`)."""
  sel = np.flatnonzero(np.repeat(keep_groups, group_size))
  kept = R.take(rows, sel)
  batch = build_rl_batch(kept["prompt"], kept["completion"], kept["loss_mask"], pad_id=pad_id,
                         completion_width=round_up(max_new_tokens, 32))
  if "rewards" in fields:
    batch["rewards"] = np.asarray(rewards, np.float32)[sel]
    batch["advantages"] = np.zeros(len(sel), np.float32)
  else:
    batch["advantages"] = np.asarray(group_advantages(np.asarray(rewards)[sel], group_size,
                                                      scale=advantage_scale), np.float32)
  batch["is_off_policy"] = np.asarray(kept["off_policy"], bool)
  batch["behaviour_logp"] = pad_ragged(behaviour_logp(kept), batch["completion"].shape[1])
  return batch


def behaviour_logp(rows) -> list:
  """Per row, the log-probs of the policy that produced its tokens: the rollout engine's at sampling time
  (`rollout_logp`) for on-policy rows, the recorded ones for off-policy rows (an ExGRPO replay's; a LUFFY
  trace's zeros: behaviour probability 1)."""
  return [b if off else r for b, r, off in zip(rows["behaviour_logp"], rows["rollout_logp"], rows["off_policy"])]


def shard_update_batch(batch: dict, mesh) -> dict:
  """The batch padded to a multiple of the mesh's devices (`pad_rows`) and split row-wise over all of
  them; 0-d fields are replicated. Across processes every process passes the same host batch."""
  if jax.process_count() > 1:  # replicated rollouts must agree, or the global batch is silently wrong
    from jax.experimental import multihost_utils
    multihost_utils.assert_equal(batch["tokens"], "the processes' RL batches differ")
  batch = pad_rows(batch, mesh.devices.size)
  return {k: put(v, batch_sharding(mesh, 0, np.ndim(v)) if np.ndim(v) else NamedSharding(mesh, P()))
          for k, v in batch.items()}


def reuses_current_logp(rl, steps: int) -> bool:
  """Whether the old log-probs of a rollout batch getting `steps` optimizer steps can be the current
  policy's own logp under stop_gradient (`fineflax.rl.step.rl_loss(on_policy=True)`) instead of one more
  forward: rl.old_logp == "auto", steps == 1 (the params that sampled the batch are the ones the single
  step differentiates; with several mini-batches or iterations the 2nd+ step needs the pre-update logp),
  and no critic (PPO's GAE targets read old_logp on the host before any step). Every other objective
  reads old_logp only inside its loss: GRPO / DAPO / Search-R1's GRPO on every row, LUFFY and ExGRPO on
  their on-policy rows (their off-policy / replayed rows use logp and behaviour_logp alone)."""
  return rl.old_logp == "auto" and steps == 1 and not rl.objective_entry.critic


def rl_update(state, base, batch, *, step_fn, logp_fn, beta: float, num_iterations: int, mesh=None,
              reference=None, plan=None, on_policy: bool = False):
  """(new state, metrics of the last update): old/ref log-probs, then `num_iterations` updates.

  on_policy: `step_fn` was made with on_policy=True (`fineflax.rl.step.make_rl_fns`; only valid when
  `reuses_current_logp(rl, num_iterations)`): no old_logp pass, the step reads its own logp.

  `reference`: the trainable argument of the KL reference's log-probs, logp_fn(reference, base, .):
  None = the base with the LoRA off; in full training (base None) the frozen initial parameters.

  With `mesh` the batch is split over its devices first (`shard_update_batch`); `state` and `base` are
  expected placed already (`fineflax.mesh.replicate` / `shard_params`). With `plan` (mini-/micro-batches
  or PPO's critic: `fineflax.rl.minibatch.UpdatePlan`) the plan does the whole update instead."""
  if plan is not None:
    return plan.update(state, base, batch, mesh=mesh, reference=reference)
  if mesh is not None:
    batch = shard_update_batch(batch, mesh)
  if on_policy and num_iterations != 1:
    raise ValueError(f"rl_update(on_policy=True) with num_iterations={num_iterations}: the 2nd+ update needs "
                     "the recomputed old log-probs")
  if not on_policy:
    batch = dict(batch, old_logp=logp_fn(state["params"], base, batch)[0])
  if beta:
    batch["ref_logp"] = logp_fn(reference, base, batch)[0]
  for _ in range(num_iterations):
    state, metrics = step_fn(state, base, batch)
  return state, {k: float(v) for k, v in jax.device_get(metrics).items()}
