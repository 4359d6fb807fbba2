"""The learner of an RL run: frozen base + LoRA train state, the objective's jitted step and log-prob
functions, the policy that rolls out, and the update.

  Learner(config, rl, mesh=None, guidance=None, replay=None)
    config       the run's ConfigDict (model, lora, optimizer, seed sections; `fineflax.train.model_setup`)
    rl           the checked `RLConfig` (`fineflax.rl.config`)
    mesh         rows of rollouts and updates split over its devices; the base split over its `fsdp` axis
    guidance / replay   the off-policy sources of the objective (`fineflax.rl.guidance.Guidance`, LUFFY;
                 `fineflax.rl.replay.Replay`, ExGRPO), read by `collect`

  policy(lora)                 base + that LoRA with the run's sampling settings (`fineflax.rl.policy`)
  collect(lora, env, ...)      one step's scored groups (`fineflax.rl.collect.collect`) with the sources
  groups_batch(groups)         the update batch of the kept groups (group advantages, `fineflax.rl.update`)
  update(state, batch)         old/ref log-probs, then rl.num_iterations updates -> (state, metrics)
  sft_update(state, batch)     one SFT step on demonstrations (the SFT phase, `fineflax.rl.sft_phase`)

`state` holds the train state the run starts from (replicated over the mesh); the loop passes states in
and out of `update`, which is pure (the loop keeps the previous state when a step goes non-finite).
`train_and_export(job, ...)` is the RL jobs' common end: the loop over the job's hooks, then the summary
and the PEFT adapter.
"""
from __future__ import annotations

import functools

import numpy as np

from fineflax import lora as lora_lib
from fineflax.rl.batch import build_rl_batch, round_up
from fineflax.rl.collect import Groups, collect, kept_groups
from fineflax.rl.config import RLConfig
from fineflax.rl.policy import Policy
from fineflax.rl.step import make_rl_fns
from fineflax.rl.update import rl_update, update_batch
from fineflax.mesh import replicate, shard_params
from fineflax.train.loop import train_loop
from fineflax.train.model_setup import compute_dtype, export_adapter, setup_model
from fineflax.train.optim import make_optimizer
from fineflax.train.sft_step import make_sft_fns
from fineflax.train.state import init_state
from fineflax.train.workdir import finish_run


class Learner:
  """Base weights, train state, step and log-prob functions of one RL run (module docstring)."""

  def __init__(self, config, rl: RLConfig, *, mesh=None, guidance=None, replay=None):
    self.config, self.rl, self.mesh = config, rl, mesh
    self.guidance, self.replay = guidance, replay
    self.objective = rl.objective_entry
    self.dtype = compute_dtype(config)
    self.base, self.model_config, self.tok, self.lora_cfg, lora = setup_model(config)
    if mesh is not None:
      self.base = shard_params(self.base, mesh)
    self.scale = lora_lib.lora_scale(self.lora_cfg)
    self.optimizer = make_optimizer(config.optimizer)
    self.step_fn, self.logp_fn = make_rl_fns(self.optimizer, objective=rl.objective,
                                             loss_kwargs=self.objective.kwargs(rl), fwd_kwargs=self.fwd_kwargs)
    self.state = init_state(lora, self.optimizer, config.seed)
    if mesh is not None:
      self.state = replicate(self.state, mesh)

  @property
  def fwd_kwargs(self) -> dict:
    """The forward settings of `fineflax.rl.step.completion_logp` (the rollouts' temperature)."""
    m = self.config.model
    return dict(model_config=self.model_config, lora_scale=self.scale, remat=m.remat, dtype=self.dtype,
                logits_chunk=m.logits_chunk, temperature=self.rl.temperature)

  def policy(self, lora) -> Policy:
    """The policy of base + `lora` (None: the base alone) with the run's sampling settings."""
    rl = self.rl
    return Policy(self.base, self.model_config, self.tok, lora, self.scale, self.dtype, rl.temperature,
                  rl.top_p, rl.max_new_tokens, self.mesh, rl.dense_rollouts)

  @functools.cached_property
  def pad_id(self) -> int:
    return self.policy(None).pad_id

  def mean_entropy(self, lora, prompt, trajectories) -> np.ndarray:
    """Mean token entropy of stored trajectories under base + `lora` (ExGRPO's trajectory selection)."""
    comps = [t.tokens.tolist() for t in trajectories]
    batch = build_rl_batch([prompt.tolist()] * len(comps), comps, [[1.0] * len(c) for c in comps],
                           pad_id=self.pad_id, completion_width=round_up(self.rl.max_new_tokens, 32))
    _, ent = self.logp_fn(lora, self.base, batch)
    ent, mask = np.asarray(ent), batch["mask"]
    return (ent * mask).sum(1) / np.maximum(mask.sum(1), 1)

  def collect(self, lora, env, items, order, cursor: int, rng, reward_weights) -> Groups:
    """One step's scored groups of `env` under base + `lora`, with the guidance / replay rows."""
    return collect(env, self.policy(lora), items, order, cursor, rng, self.rl, reward_weights,
                   guidance=self.guidance, replay=self.replay,
                   entropy_fn=functools.partial(self.mean_entropy, lora))

  def groups_batch(self, groups: Groups) -> dict:
    """The update batch of the kept groups (`kept_groups`) with the fields the objective reads."""
    rl = self.rl
    return update_batch(groups.rows, groups.rewards, kept_groups(groups, rl), group_size=rl.group_size,
                        pad_id=self.pad_id, max_new_tokens=rl.max_new_tokens,
                        advantage_scale=rl.advantage_scale, fields=self.objective.batch_fields)

  def update(self, state, batch: dict):
    """(new state, metrics of the last update): `fineflax.rl.update.rl_update` on this learner's base."""
    return rl_update(state, self.base, batch, step_fn=self.step_fn, logp_fn=self.logp_fn, beta=self.rl.beta,
                     num_iterations=self.rl.num_iterations, mesh=self.mesh)

  @functools.cached_property
  def sft_fn(self):
    """The jitted SFT step (`fineflax.train.sft_step`) with this learner's optimizer and forward settings."""
    fwd = self.fwd_kwargs
    fwd.pop("temperature")
    return make_sft_fns(self.optimizer, **fwd)[0]

  def sft_update(self, state, batch: dict):
    """(new state, metrics) of one SFT step on `batch` (placed on the mesh by the caller)."""
    return self.sft_fn(state, self.base, batch)

  def fresh_moments(self, state) -> dict:
    """`state` with the optimizer moments re-initialised (RL after the SFT phase starts from its adapter)."""
    return dict(state, opt_state=self.optimizer.init(state["params"]))


def train_and_export(job, config, workdir: str, *, desc: str, **summary_extra) -> dict:
  """`train_loop` over `job.hooks()` from `job.learner.state` for config.num_steps, then the run summary
  and the adapter export (`finish_run`, `summary_extra` added to the summary); the RL jobs' result
  {history, workdir, job, summary, exit_code}. The learner keeps the final state."""
  learner = job.learner
  result = train_loop(job.hooks(), learner.state, config, workdir, num_steps=config.num_steps, desc=desc,
                      eval_every=config.eval_every, eval_at_start=config.eval_at_start)
  learner.state = result.state
  summary = finish_run(workdir, result, lambda: export_adapter(learner.state["params"], learner.lora_cfg,
                                                               learner.model_config, config, workdir),
                       **summary_extra)
  return {"history": result.history, "workdir": workdir, "job": job, "summary": summary,
          "exit_code": result.exit_code}
