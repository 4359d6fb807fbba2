"""RL job: rollout -> score -> group advantages -> update, for any objective of the table and any env.

Each step: `prompts_per_step` questions of the environment (`config.env`), `group_size` rows each:
on-policy rollouts, plus the objective's off-policy rows (LUFFY guidance: `rl.luffy.n_off`
demonstrations; ExGRPO replay: a stored trajectory once the solve rate passes `rl.exgrpo.threshold`);
rewards from the registry (`config.rewards`); group advantages over the kept groups (DAPO dynamic
sampling drops zero-variance groups and refills); old/ref log-probs; `rl.num_iterations` updates.
With `rl.sft_steps` > 0 the first steps are SFT steps on the demonstrations (`fineflax.rl.sft_phase`).
The loop (resume, evaluation, checkpoints, stop handling) is `fineflax.train.loop`.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from fineflax import lora as lora_lib
from fineflax.config_checks import ConfigError, positive_int, require
from fineflax.envs import get_env_class, make_env
from fineflax.jobs.common import compute_dtype, export_adapter, finish_run, make_workdir, preflight, setup_model
from fineflax.rl.batch import build_rl_batch, round_up
from fineflax.rl.collect import collect, kept_groups
from fineflax.rl.guidance import Guidance
from fineflax.rl.objectives import validate_rl
from fineflax.rl.order import EpochOrder
from fineflax.rl.policy import Policy
from fineflax.rl.replay import Replay
from fineflax.rl.sft_phase import demonstration_rows, sft_batch
from fineflax.rl.step import make_rl_fns
from fineflax.rl.update import rl_update, update_batch
from fineflax.train.loop import Hooks, read_history, train_loop
from fineflax.mesh import make_mesh, replicate, shard_batch, shard_params
from fineflax.train.optim import make_optimizer
from fineflax.train.sft_step import make_sft_fns
from fineflax.train.state import init_state


def setup_learner(job, config, mesh=None) -> None:
  """Sets on `job` what every RL job shares: config, rl, objective (validated), dtype, the frozen base
  (split over the mesh's `fsdp` axis when a mesh is given), model config, tokenizer, LoRA config and
  scale, optimizer, the jitted `step_fn` / `logp_fn` of the objective, and the train state (replicated
  over the mesh)."""
  rl = config.rl
  job.config, job.rl, job.mesh = config, rl, mesh
  job.objective = validate_rl(rl)
  job.dtype = compute_dtype(config)
  job.base, job.model_config, job.tok, job.lora_cfg, lora = setup_model(config)
  if mesh is not None:
    job.base = shard_params(job.base, mesh)
  job.scale = lora_lib.lora_scale(job.lora_cfg)
  job.optimizer = make_optimizer(config.optimizer)
  fwd = dict(model_config=job.model_config, lora_scale=job.scale, remat=config.model.remat,
             dtype=job.dtype, logits_chunk=config.model.logits_chunk, temperature=rl.temperature)
  job.step_fn, job.logp_fn = make_rl_fns(job.optimizer, objective=rl.objective,
                                         loss_kwargs=job.objective.kwargs(rl), fwd_kwargs=fwd)
  job.state = init_state(lora, job.optimizer, config.seed)
  if mesh is not None:
    job.state = replicate(job.state, mesh)


class RLJob:
  """The frozen base, jitted functions, environment and components of one RL run."""

  def __init__(self, config):
    validate(config)
    rl = config.rl
    off_policy = validate_rl(rl).off_policy
    # traces files are read before the model loads: a bad one stops the run at once
    self.guidance = Guidance(rl.luffy.n_off, rl.luffy.traces_path) if off_policy == "guidance" else None
    self.sft_steps = int(rl.get("sft_steps", 0))
    if self.sft_steps:  # SFT phase: the objective's demonstrations (a traces file too), or the env's own
      self.sft_guidance = self.guidance or Guidance(1, rl.luffy.traces_path if "luffy" in rl else "")
    setup_learner(self, config, make_mesh(config.mesh.data, config.mesh.fsdp))  # rows over every device
    self.env = make_env(config, self.tok)
    self.replay = (Replay(rl.group_size, rl.exgrpo, config.seed + 1)
                   if self.objective.off_policy == "replay" else None)
    if self.sft_steps:
      self.sft_fn, _ = make_sft_fns(self.optimizer, model_config=self.model_config, lora_scale=self.scale,
                                    remat=config.model.remat, dtype=self.dtype,
                                    logits_chunk=config.model.logits_chunk)
    # question at every position (fineflax.rl.order): the env's own (e.g. reshuffled each epoch), else one
    # permutation repeated every epoch
    self.order = (self.env.train_order(config.seed) if hasattr(self.env, "train_order")
                  else EpochOrder(len(self.env.train_items), config.seed))
    self.rng = jax.random.PRNGKey(config.seed + 7)
    self.pad_id = self.policy(None).pad_id

  def policy(self, lora) -> Policy:
    rl = self.rl
    return Policy(self.base, self.model_config, self.tok, lora, self.scale, self.dtype, rl.temperature,
                  rl.top_p, rl.max_new_tokens, self.mesh, bool(rl.get("dense_rollouts", False)))

  def mean_entropy(self, lora, prompt, trajectories) -> np.ndarray:
    """Mean token entropy of stored trajectories under the current policy (ExGRPO selection)."""
    comps = [t.tokens.tolist() for t in trajectories]
    batch = build_rl_batch([prompt.tolist()] * len(comps), comps, [[1.0] * len(c) for c in comps],
                           pad_id=self.pad_id, completion_width=round_up(self.rl.max_new_tokens, 32))
    _, ent = self.logp_fn(lora, self.base, batch)
    ent, mask = np.asarray(ent), batch["mask"]
    return (ent * mask).sum(1) / np.maximum(mask.sum(1), 1)

  def sft_step(self, state, step: int):
    """One SFT step on the demonstrations of the questions this step would roll out."""
    rl = self.rl
    items = [self.env.train_items[self.order[(step - 1) * rl.prompts_per_step + i]]
             for i in range(rl.prompts_per_step)]
    rows = demonstration_rows(self.sft_guidance, self.env, self.policy(state["lora"]), items)
    batch = sft_batch(rows, pad_id=self.pad_id, max_new_tokens=rl.max_new_tokens,
                      multiple=self.mesh.devices.size if self.mesh is not None else 1)
    if self.mesh is not None:
      batch = shard_batch(batch, self.mesh, batch_axis=1)
    state, m = self.sft_fn(state, self.base, batch)
    m = jax.device_get(m)
    return state, {"loss": float(m["loss"]), "sft_loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]),
                   "sft_phase": 1.0}

  def step(self, state, step: int):
    """One RL step (or, for step <= rl.sft_steps, one SFT step) -> (new state, scalars)."""
    if step <= self.sft_steps:
      return self.sft_step(state, step)
    if self.sft_steps and step == self.sft_steps + 1:  # RL starts from the SFT adapter, fresh moments
      state = dict(state, opt_state=self.optimizer.init(state["lora"]))
    rl, t0 = self.rl, time.time()
    lora = state["lora"]
    g = collect(self.env, self.policy(lora), self.env.train_items, self.order, (step - 1) * rl.prompts_per_step,
                jax.random.fold_in(self.rng, step), rl, self.config.rewards, guidance=self.guidance,
                replay=self.replay, entropy_fn=lambda p, ts: self.mean_entropy(lora, p, ts))
    t_roll = time.time() - t0
    on = ~np.asarray(g.rows["off_policy"])
    solve_rate = float(g.correct[on].mean())
    if self.replay:
      self.replay.record(g.idx, g.rows, g.rewards, g.correct, rl.group_size)
      self.replay.solve_rate = solve_rate
    batch = update_batch(g.rows, g.rewards, kept_groups(g, rl), group_size=rl.group_size, pad_id=self.pad_id,
                         max_new_tokens=rl.max_new_tokens, advantage_scale=rl.advantage_scale,
                         fields=self.objective.batch_fields)
    state, metrics = rl_update(state, self.base, batch, step_fn=self.step_fn, logp_fn=self.logp_fn,
                               beta=rl.beta, num_iterations=rl.num_iterations, mesh=self.mesh)
    on_examples = [e for e, o in zip(g.examples, on) if o]
    return state, {
        **metrics, "reward_mean": float(g.rewards[on].mean()), "reward_std": float(g.rewards[on].std()),
        "solve_rate": solve_rate, "zero_variance_groups": float(g.zero_var.mean()),
        "completion_length": float(np.mean([len(c) for c, o in zip(g.rows["completion"], on) if o])),
        "time_rollout_s": t_roll, "time_update_s": time.time() - t0 - t_roll,
        **({"replay_share": g.replayed / len(g.idx), **self.replay.stats()} if self.replay else {}),
        **{f"reward_{k}": float(v[on].mean()) for k, v in g.per_fn.items()},
        **{f"reward_errors_{k}": float(v) for k, v in g.errors.items()},
        **self.env.rollout_metrics(on_examples)}

  def hooks(self) -> Hooks:
    def evaluate(state):
      policy = self.policy(state["lora"])
      if hasattr(self.env, "evaluate_all"):  # held-out set and extra (out-of-distribution) sets
        return self.env.evaluate_all(policy)
      return self.env.evaluate(policy, self.env.eval_items)

    return Hooks(step=self.step, evaluate=evaluate,
                 eval_metric=self.env.eval_metric, eval_mode="max",
                 meta=lambda: {"replay": self.replay.state_dict()} if self.replay else {},
                 restore_meta=lambda m: self.replay.load_state_dict(m["replay"]) if self.replay else None,
                 postfix=("reward_mean", "loss"))


def validate(config) -> None:
  """The objective and its section (`validate_rl`), the environment, the reward names and the run cadence."""
  from fineflax.rewards import REWARDS
  obj = validate_rl(config.rl)
  env = get_env_class(config.env)
  if hasattr(env, "validate"):
    env.validate(config)
  if obj.off_policy == "replay" and not env.supports_replay:
    raise ConfigError(f"config.rl.objective={config.rl.objective!r} is not supported by config.env={config.env!r}")
  if hasattr(env, "validate"):  # the environment's own section (e.g. its dataset files), before weights load
    env.validate(config)
  for name in config.rewards:
    require(config, f"rewards.{name}", lambda _: name in REWARDS,
            f"unknown reward {name!r}; registered: {', '.join(sorted(REWARDS))}")
  positive_int(config, "num_steps")
  require(config, "rl.sft_steps", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0 (0 = no SFT phase)")


def run(config, workdir: str | None) -> dict:
  validate(config)
  done = preflight(config, workdir, config.num_steps)  # before the model loads
  if done is not None:
    return {"history": read_history(workdir), "workdir": workdir, "job": None, "summary": done, "exit_code": 0}
  job = RLJob(config)  # validates and loads before anything is created on disk
  workdir = make_workdir(config, workdir)
  result = train_loop(job.hooks(), job.state, config, workdir, num_steps=config.num_steps,
                      desc=f"{config.env}/{config.rl.objective}", eval_every=config.eval_every,
                      eval_at_start=config.eval_at_start)
  job.state = result.state
  summary = finish_run(workdir, result, lambda: export_adapter(job.state["lora"], job.lora_cfg,
                                                               job.model_config, config, workdir))
  return {"history": result.history, "workdir": workdir, "job": job, "summary": summary,
          "exit_code": result.exit_code}
