"""RL job: rollout -> score -> group advantages -> update, for any objective of the table and any env.

Each step: `prompts_per_step` questions of the environment (`config.env`), `group_size` rows each:
on-policy rollouts, plus the objective's off-policy rows (LUFFY guidance: `rl.luffy.n_off`
demonstrations; ExGRPO replay: a stored trajectory once the solve rate passes `rl.exgrpo.threshold`);
rewards from the registry (`config.rewards`); group advantages over the kept groups (DAPO dynamic
sampling drops zero-variance groups and refills); old/ref log-probs; `rl.num_iterations` updates.
With `rl.async_steps` = k >= 1 the batch of step t was generated up to k updates earlier, the next one
generating meanwhile (on `config.mesh.rollout`'s devices when set): `fineflax.rl.async_rollouts`.
With `rl.sft_steps` > 0 the first steps are SFT steps on the demonstrations (`fineflax.rl.sft_phase`).
The loop (resume, evaluation, checkpoints, stop handling) is `fineflax.train.loop`.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from fineflax.config_checks import ConfigError, positive_int
from fineflax.envs import get_env_class, make_env
from fineflax.jobs import resolve
from fineflax.rewards.registry import check_reward_names
from fineflax.rl.async_rollouts import AsyncRollouts, RolloutGroup, split_devices
from fineflax.train.sections import MeshSection, Sections
from fineflax.rl.config import RLConfig
from fineflax.rl.guidance import Guidance
from fineflax.rl.learner import Learner, train_and_export
from fineflax.rl.order import EpochOrder
from fineflax.rl.replay import Replay
from fineflax.rl.sft_phase import demonstration_rows, sft_batch
from fineflax.train.loop import Hooks, read_history
from fineflax.mesh import make_mesh, rollout_mesh, shard_batch
from fineflax.train.workdir import make_workdir, preflight


def off_policy_sources(rl: RLConfig, seed: int) -> tuple[Guidance | None, Replay | None]:
  """(guidance, replay) of the objective: LUFFY's demonstrations (a traces file is read here, before the
  model loads, so a bad one stops the run at once) or ExGRPO's replay buffer; None for the other."""
  kind = rl.objective_entry.off_policy
  guidance = Guidance(rl.luffy.n_off, rl.luffy.traces_path) if kind == "guidance" else None
  replay = Replay(rl.group_size, rl.exgrpo, seed + 1) if kind == "replay" else None
  return guidance, replay


def run_meshes(mesh: MeshSection, devices=None):
  """(update mesh, rollout mesh or None) of config.mesh over `devices` (default all): data x fsdp over every
  device; with config.mesh.model > 1 the rollouts' mesh: the devices in groups of that many, each group
  one tensor-parallel engine, rows split over the groups (`fineflax.mesh.rollout_mesh`; one process only).
  ConfigError naming the knob when a size does not divide
  the devices. `mesh`: the typed config.mesh, or a job's ConfigDict (read through MeshSection.of)."""
  m = MeshSection.of(mesh)
  try:
    mesh = make_mesh(m.data, m.fsdp, devices)
  except ValueError as e:
    raise ConfigError(f"config.mesh (data={m.data}, fsdp={m.fsdp}): {e}") from None
  model = m.model
  if model > 1 and jax.process_count() > 1:
    raise ConfigError(f"config.mesh.model={model}: tensor-parallel rollouts run in one process; this run has "
                      f"{jax.process_count()} (set config.mesh.model=1)")
  try:
    return mesh, rollout_mesh(model, mesh.devices)
  except ValueError as e:
    raise ConfigError(f"config.mesh.model={model}: {e}") from None


class RLJob:
  """Wiring of one RL run: the environment, the learner with its off-policy sources, the question order
  and the optional SFT phase; `step` is one step of `fineflax.train.loop`."""

  def __init__(self, config, rl: RLConfig | None = None, sections: Sections | None = None):
    """`rl`, `sections`: the typed config.rl and model/train/mesh sections built at resolve time (None:
    built here from `config`)."""
    rl = RLConfig.from_config(config.rl) if rl is None else rl
    sections = Sections.of(config) if sections is None else sections
    self.config, self.rl, self.sections = config, rl, sections
    self.guidance, self.replay = off_policy_sources(rl, config.seed)
    self.sft_steps = rl.sft_steps
    if self.sft_steps:  # SFT phase: the objective's demonstrations (a traces file too), or the env's own
      self.sft_guidance = self.guidance or Guidance(1, rl.luffy.traces_path if rl.luffy else "")
    learner_devices, rollout_devices = split_devices(config)  # config.mesh.rollout: an async run's group
    mesh, rollouts = run_meshes(sections.mesh, learner_devices)
    self.learner = Learner(config, rl, mesh=mesh, rollout_mesh=rollouts,  # rows over every learner device
                           guidance=self.guidance, replay=self.replay, sections=sections)
    self.env = make_env(config, self.learner.tok)
    # question at every position (fineflax.rl.order): the env's own (e.g. reshuffled each epoch), else one
    # permutation repeated every epoch
    self.order = (self.env.train_order(config.seed) if hasattr(self.env, "train_order")
                  else EpochOrder(len(self.env.train_items), config.seed))
    self.rng = jax.random.PRNGKey(config.seed + 7)
    self.pipeline = (AsyncRollouts(rl.async_steps, config.num_steps, self.collect,
                                   RolloutGroup(self.learner, rollout_devices) if rollout_devices else None)
                     if rl.async_steps else None)

  def sft_step(self, state, step: int):
    """One SFT step on the demonstrations of the questions this step would roll out."""
    rl, learner = self.rl, self.learner
    items = [self.env.train_items[self.order[(step - 1) * rl.prompts_per_step + i]]
             for i in range(rl.prompts_per_step)]
    rows = demonstration_rows(self.sft_guidance, self.env, learner.policy(state["params"]), items)
    mesh = learner.mesh
    batch = sft_batch(rows, pad_id=learner.pad_id, max_new_tokens=rl.max_new_tokens,
                      multiple=mesh.devices.size if mesh is not None else 1)
    if mesh is not None:
      batch = shard_batch(batch, mesh, batch_axis=1)
    state, m = learner.sft_update(state, batch)
    m = jax.device_get(m)
    return state, {"loss": float(m["loss"]), "sft_loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]),
                   "sft_phase": 1.0}

  def step(self, state, step: int):
    """One RL step (or, for step <= rl.sft_steps, one SFT step) -> (new state, scalars); with rl.async_steps
    the batch is one the pipeline generated up to k updates earlier (`fineflax.rl.async_rollouts`)."""
    if step <= self.sft_steps:
      return self.sft_step(state, step)
    if self.sft_steps and step == self.sft_steps + 1:  # RL starts from the SFT adapter, fresh moments
      state = self.learner.fresh_moments(state)
    if self.pipeline is not None:
      return self.pipeline.step(state, step, self.record, self.update)
    t0 = time.time()
    g = self.collect(state["params"], step)
    t_roll = time.time() - t0
    self.record(g)
    state, metrics = self.update(state, g)
    return state, {**metrics, "time_rollout_s": t_roll, "time_update_s": time.time() - t0 - t_roll}

  def collect(self, params, step: int, policy=None, entropy_fn=None):
    """Batch `step`'s scored groups (its questions and rng) under the trainable `params` (or `policy`)."""
    rl = self.rl
    return self.learner.collect(params, self.env, self.env.train_items, self.order, (step - 1) * rl.prompts_per_step,
                                jax.random.fold_in(self.rng, step), self.config.rewards, policy=policy,
                                entropy_fn=entropy_fn)

  def record(self, g) -> None:
    """ExGRPO: the replay buffer records the groups and the batch's solve rate."""
    if self.replay:
      on = ~np.asarray(g.rows["off_policy"])
      self.replay.record(g.idx, g.rows, g.rewards, g.correct, self.rl.group_size)
      self.replay.solve_rate = float(g.correct[on].mean())

  def update(self, state, g):
    """(new state, metrics): the learner's update on the groups, with the batch's reward / length metrics."""
    state, metrics = self.learner.update(state, self.learner.groups_batch(g))
    on = ~np.asarray(g.rows["off_policy"])
    on_examples = [e for e, o in zip(g.examples, on) if o]
    return state, {
        **metrics, "reward_mean": float(g.rewards[on].mean()), "reward_std": float(g.rewards[on].std()),
        "solve_rate": float(g.correct[on].mean()), "zero_variance_groups": float(g.zero_var.mean()),
        "completion_length": float(np.mean([len(c) for c, o in zip(g.rows["completion"], on) if o])),
        **({"replay_share": g.replayed / len(g.idx), **self.replay.stats()} if self.replay else {}),
        **{f"reward_{k}": float(v[on].mean()) for k, v in g.per_fn.items()},
        **{f"reward_errors_{k}": float(v) for k, v in g.errors.items()},
        **self.env.rollout_metrics(on_examples)}

  def hooks(self) -> Hooks:
    def evaluate(state):
      policy = self.learner.policy(state["params"])
      if hasattr(self.env, "evaluate_all"):  # held-out set and extra (out-of-distribution) sets
        return self.env.evaluate_all(policy)
      return self.env.evaluate(policy, self.env.eval_items)

    def meta():
      return {**({"replay": self.replay.state_dict()} if self.replay else {}),
              **({"async": self.pipeline.state_dict()} if self.pipeline else {})}

    def restore_meta(m):
      if self.replay:
        self.replay.load_state_dict(m["replay"])
      if self.pipeline and "async" in m:
        self.pipeline.load_state_dict(m["async"])

    return Hooks(step=self.step, evaluate=evaluate, eval_metric=self.env.eval_metric, eval_mode="max",
                 meta=meta, restore_meta=restore_meta, postfix=("reward_mean", "loss"))


def check_micro_batch_budget(rl: RLConfig, env, config) -> None:
  """ConfigError when a training row could overflow rl.micro_batch_tokens: its longest possible length is the
  environment's longest prompt (`Env.longest_prompt_tokens`, when it can tell) + rl.max_new_tokens."""
  if not rl.micro_batch_tokens:
    return
  prompt = env.longest_prompt_tokens(config)
  if prompt is not None and prompt + rl.max_new_tokens > rl.micro_batch_tokens:
    raise ConfigError(f"config.rl.micro_batch_tokens={rl.micro_batch_tokens}: a row can hold "
                      f"{prompt + rl.max_new_tokens} tokens (the longest prompt of config.env={config.env!r}, "
                      f"{prompt}, + rl.max_new_tokens={rl.max_new_tokens}); set at least "
                      f"{prompt + rl.max_new_tokens}, or 0 (off)")


def validate(config) -> RLConfig:
  """This job's part of `fineflax.jobs.resolve.validate`: config.rl (`RLConfig`), the environment
  (`Env.validate`; replay support), the reward names and num_steps. Returns the RLConfig."""
  rl = RLConfig.from_config(config.rl)
  env = get_env_class(config.env)
  if rl.objective_entry.off_policy == "replay" and not env.supports_replay:
    raise ConfigError(f"config.rl.objective={rl.objective!r} is not supported by config.env={config.env!r}")
  env.validate(config)
  check_micro_batch_budget(rl, env, config)
  check_reward_names(config)
  positive_int(config, "num_steps")
  return rl


def run(config, workdir: str | None) -> dict:
  rl = resolve.validate(config)
  sections = Sections.of(config)  # the typed model/train/mesh sections, once, beside the RLConfig
  done = preflight(config, workdir, config.num_steps)  # before the model loads
  if done is not None:
    return {"history": read_history(workdir), "workdir": workdir, "job": None, "summary": done, "exit_code": 0}
  job = RLJob(config, rl, sections)  # loads before anything is created on disk
  return train_and_export(job, config, make_workdir(config, workdir), desc=f"{config.env}/{config.rl.objective}")
