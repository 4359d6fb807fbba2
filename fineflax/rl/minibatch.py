"""One rollout batch -> optimizer steps over mini-batches of micro-batches, and PPO's critic steps.

  plan = UpdatePlan(rl, optimizer=..., objective=..., loss_kwargs=..., fwd_kwargs=..., logp_fn=..., pad_id=...,
                    critic=None | fineflax.rl.ppo.Critic)
  state, metrics = plan.update(state, base, batch, mesh=None)       (`fineflax.rl.update.rl_update(plan=)`)

The order follows verl (`update_policy` / `update_critic` of dp_actor / dp_critic, Search-R1's fork):
  1. the batch's rows are cut into mini-batches of `rl.mini_batch_size` prompts (whole groups of
     group_size rows, in order; 0 = the whole batch): prompts_per_step / mini_batch_size optimizer steps;
  2. with the state before any update, per mini-batch: old_logp (+ ref_logp when beta > 0 or PPO's
     kl_in_reward, + the critic's values); old_logp is skipped when the batch gets exactly one optimizer
     step (`fineflax.rl.update.reuses_current_logp`: the step reads its own logp under stop_gradient);
  3. PPO: token rewards with the KL penalty, GAE advantages and returns over the whole batch
     (`fineflax.rl.ppo.ppo_targets`);
  4. `num_iterations` epochs, each one optimizer step per mini-batch: the critic's (PPO), then the policy's.
A mini-batch is one padded micro-batch; with `rl.micro_batch_size` > 0 consecutive slices of D x
micro_batch_size rows (padded as the whole batch, the last one with `pad_rows`: one compiled shape; verl's
ppo_micro_batch_size_per_gpu); or with `rl.micro_batch_tokens` > 0 its rows packed into micro-batches of D
rows x micro_batch_tokens tokens (`fineflax.rl.micro`, D = the mesh's devices). The forward passes of
step 2 run on the same micro-batches. Its gradient is the sum of its micro-batches'
(`fineflax.train.grad_accum`), each normalised by the whole mini-batch: `loss_weights`
(`fineflax.rl.losses.token_weights` of agg_mode), `num_tokens`, and the critic's `value_weights`.
Metrics: the mean over this batch's optimizer steps; `skipped` (rl.skip_grad_bound) counts skipped steps, the
maxima of `fineflax.rl.importance.MAXIMUM_METRICS` take the largest.
donate=True (full training): every optimizer step donates the state it is given (the caller's is deleted by
the first one; step 2 reads nothing of it afterwards), and a non-finite one leaves the params unchanged.
"""
from __future__ import annotations

import functools

import jax
import numpy as np

from fineflax.rl import micro as M
from fineflax.rl.batch import pad_rows
from fineflax.rl.importance import MAXIMUM_METRICS
from fineflax.rl.losses import token_weights
from fineflax.rl.ppo import ppo_targets, response_mask
from fineflax.rl.step import rl_loss
from fineflax.rl.update import reuses_current_logp, shard_update_batch
from fineflax.train.grad_accum import accumulate, make_micro_grad, step_state


def split_rows(batch: dict, rows: int) -> list[dict]:
  """Consecutive slices of `rows` rows of a host batch (the last may hold fewer); 0-d fields copied."""
  b = batch["tokens"].shape[0]
  rows = rows or b
  return [{k: (np.asarray(v)[i:i + rows] if np.ndim(v) else v) for k, v in batch.items()}
          for i in range(0, b, rows)]


class UpdatePlan:
  """The update of one rollout batch in mini-/micro-batches (module docstring)."""

  def __init__(self, rl, *, optimizer, objective: str, loss_kwargs: dict, fwd_kwargs: dict, logp_fn, pad_id: int,
               critic=None, donate: bool = False):
    self.rl, self.logp_fn, self.pad_id, self.critic = rl, logp_fn, pad_id, critic
    self.rows = rl.mini_batch_size * rl.group_size
    # by on_policy (`rl_loss`): True reads old_logp from the step's own logp (one step per rollout batch)
    self.micro = {on: make_micro_grad(functools.partial(rl_loss, objective=objective, loss_kwargs=loss_kwargs,
                                                        fwd_kwargs=fwd_kwargs, on_policy=on),
                                      maximum=MAXIMUM_METRICS)
                  for on in (False, True)}
    # donate (full training): each optimizer step writes the state into the buffers of the one before
    self.apply = jax.jit(functools.partial(step_state, optimizer=optimizer, skip_grad_bound=rl.skip_grad_bound,
                                           skip_nonfinite=donate), donate_argnums=(0,) if donate else ())

  @property
  def needs_ref(self) -> bool:
    return bool(self.rl.beta) or bool(self.critic is not None and self.rl.ppo.kl_in_reward)

  def micro_batches(self, mini: dict, devices: int, mesh) -> tuple[list[dict], object]:
    """(device micro-batches of a host mini-batch, its pack layout or None when unpacked: then the
    micro-batches' rows in order are the mini-batch's, padding rows after them)."""
    if self.rl.micro_batch_tokens:
      layout = M.pack_layout(mini["attention_mask"], mini["completion"].shape[1], self.rl.micro_batch_tokens,
                             devices)
      host = M.pack(mini, layout, self.pad_id)
    elif self.rl.micro_batch_size:
      rows = self.rl.micro_batch_size * devices
      layout, host = None, split_rows(pad_rows(mini, rows), rows)
    else:
      layout, host = None, [pad_rows(mini, max(self.rows, 1)) if self.rows else mini]
    return [shard_update_batch(mb, mesh) if mesh is not None else mb for mb in host], layout

  def _forward(self, fn, mbs, layout, rows: int) -> np.ndarray:
    """[rows, N] host array of a per-token function over the micro-batches of one mini-batch."""
    outs = [M.to_host(fn(mb)) for mb in mbs]
    return M.unpack(outs, layout) if layout is not None else np.concatenate(outs)[:rows]

  def update(self, state, base, batch: dict, *, mesh=None, reference=None):
    rl, critic = self.rl, self.critic
    devices = mesh.devices.size if mesh is not None else 1
    batch = {k: np.asarray(v) for k, v in batch.items()}
    if critic is not None and "response_mask" not in batch:  # set by a caller that padded rows (agent_rl)
      batch["response_mask"] = response_mask(batch)
    # 2. old / ref log-probs and values under the state before any update
    b = batch["tokens"].shape[0]
    on_policy = reuses_current_logp(rl, rl.num_iterations * -(-b // (self.rows or b)))  # steps: epochs x minis
    fields = {} if on_policy else {"old_logp": lambda mb: self.logp_fn(state["params"], base, mb)[0]}
    if self.needs_ref:
      fields["ref_logp"] = lambda mb: self.logp_fn(reference, base, mb)[0]
    if critic is not None:
      fields["values"] = lambda mb: critic.values(state["critic"]["params"], critic.base, mb)
    out = {k: [] for k in fields}
    for mini in split_rows(batch, self.rows) if fields else ():
      mbs, layout = self.micro_batches(mini, devices, mesh)
      for k, fn in fields.items():
        out[k].append(self._forward(fn, mbs, layout, mini["tokens"].shape[0]))
    batch.update({k: np.concatenate(v).astype(np.float32) for k, v in out.items()})
    metrics: dict[str, list] = {}
    # 3. PPO: rewards with the KL penalty, GAE over the whole batch
    if critic is not None:
      batch["advantages"], batch["returns"], m = ppo_targets(batch, rl.ppo)
      for k, v in m.items():
        metrics.setdefault(k, []).append(v)
    # the whole mini-batch's normalisers, then its device micro-batches
    minis = []
    for mini in split_rows(batch, self.rows):
      real = mini["tokens"].shape[0]
      mini = dict(mini, loss_weights=token_weights(mini["mask"], rl.agg_mode, rl.max_new_tokens, real),
                  num_tokens=np.float32(max(mini["mask"].sum(), 1.0)))
      if critic is not None:
        mini["value_weights"] = token_weights(mini["response_mask"], "token-mean")
      minis.append(self.micro_batches(mini, devices, mesh)[0])
    # 4. epochs of one step per mini-batch
    for _ in range(rl.num_iterations):
      for mbs in minis:
        if critic is not None:
          grads, m = accumulate(critic.micro, state["critic"]["params"], critic.base, mbs)
          m.pop("loss")  # value_loss_coef * vf_loss
          new_critic, m2 = critic.apply(state["critic"], grads)
          state = dict(state, critic=new_critic)  # a new dict: the caller's state stays as it was
          for k, v in {**m, **m2}.items():
            metrics.setdefault(k, []).append(v)
        grads, m = accumulate(self.micro[on_policy], state["params"], base, mbs)
        state, m2 = self.apply(state, grads)
        for k, v in {**m, **m2}.items():
          metrics.setdefault(k, []).append(v)
    metrics = jax.device_get(metrics)
    reduce = lambda k: np.sum if k == "skipped" else np.max if k in MAXIMUM_METRICS else np.mean
    return state, {k: float(reduce(k)(v)) for k, v in metrics.items()}
