"""The learner of an RL run: the train state (LoRA on a frozen base, or every parameter:
`fineflax.train.trainable`), the objective's jitted step and log-prob functions, the policy that rolls
out, and the update.

  Learner(config, rl, mesh=None, rollout_mesh=None, guidance=None, replay=None)
    config       the run's ConfigDict (model, lora, optimizer, seed sections; `fineflax.train.model_setup`)
    rl           the checked `RLConfig` (`fineflax.rl.config`)
    mesh         rows of rollouts and updates split over its devices; the base split over its `fsdp` axis
    rollout_mesh a data x model mesh (`fineflax.mesh.rollout_mesh`, config.mesh.model > 1): the rollouts
                 (generate / SamplerSession, Search-R1's multi-turn session too) split their rows over its
                 groups of config.mesh.model devices, each decoding tensor-parallel
                 (`fineflax.sampling.replicas`, `fineflax.engine.tensor_parallel`); the update keeps `mesh`
    guidance / replay   the off-policy sources of the objective (`fineflax.rl.guidance.Guidance`, LUFFY;
                 `fineflax.rl.replay.Replay`, ExGRPO), read by `collect`

  policy(params)               the model of those trainable params (base + that LoRA, or the full params
                               themselves: no weight sync) with the run's sampling settings (`fineflax.rl.policy`)
  collect(params, env, ...)    one step's scored groups (`fineflax.rl.collect.collect`) with the sources
                               (an async run passes its rollout group's policy: `fineflax.rl.async_rollouts`)
  groups_batch(groups)         the update batch of the kept groups (group advantages, `fineflax.rl.update`)
  update(state, batch)         old/ref log-probs (the reference: the base with LoRA off, or a frozen copy
                               of the initial full params; no old-logp pass when the batch gets one step:
                               `fineflax.rl.update.reuses_current_logp`), then rl.num_iterations updates
                               -> (state, metrics);
                               with mini-/micro-batches or PPO's critic through `plan` (`fineflax.rl.minibatch`)
  sft_update(state, batch)     one SFT step on demonstrations (the SFT phase, `fineflax.rl.sft_phase`)

Tensor-parallel rollouts hold the frozen base twice: the update's layout (split over fsdp) and the rollout
layout (Megatron split over "model", NF4 column kernels as column blocks: `tensor_parallel.shard_decode_params`),
made once here: the base never changes, so no step re-places it. Per device, Llama-3.1-70B shape, NF4 base,
4 devices (fsdp=4, model=4): update layout 9.20 GiB + rollout layout 9.68 GiB (column kernels keep f32
block scales: 4.5 bits) = 18.9 GiB, in both phases. The other choice, one copy re-placed into the rollout
layout at every rollout, peaks the same in the rollout phase (both layouts live while the rollout runs),
saves 9.68 GiB in the update phase only and moves the whole base between devices every step; it is what
full training does (the weights change every step: each rollout's engine re-places them). The LoRA is
re-placed at every rollout (the engine's `shard_lora`; MBs). The rollout copy is built one kernel at a time,
each by a jitted call whose output is created split over the rollout mesh (`tp_layout(mesh=...)`): no host
copy, and at most one kernel's re-layout in flight. With model = M < the D devices, the rollout copy is one
Megatron copy per group of M devices (replicated over the rollout mesh's data axis, split over its model
axis): base / M bytes on every device, the same per device as a single group's, and each group's engine
reads those shards in place (`tensor_parallel.reuse_shards`: no second copy); the rows, their KV pages and
decode logits split over the D / M groups (`fineflax.mesh.rollout_mesh`).

`state` holds the train state the run starts from (placed on the mesh by `fineflax.train.trainable`:
LoRA replicated, full params and moments split over fsdp); the loop passes states in and out of
`update`, which is pure in LoRA mode (the loop keeps the previous state when a step goes non-finite); in
full training the steps donate the state they are given (`fineflax.train.trainable.Trainable.donate`):
only the returned state may be read, and a non-finite update leaves its params unchanged.
`train_and_export(job, ...)` is the RL jobs' common end: the loop over the job's hooks, then the summary
and the export (PEFT adapter, or the merged HF folder of full training).
"""
from __future__ import annotations

import functools

import numpy as np

from fineflax import lora as lora_lib
from fineflax.config_checks import ConfigError
from fineflax.engine import tensor_parallel as tp
from fineflax.rl.batch import build_rl_batch, round_up
from fineflax.rl.collect import Groups, collect, kept_groups
from fineflax.rl.config import RLConfig
from fineflax.rl.minibatch import UpdatePlan
from fineflax.rl.ppo import Critic
from fineflax.rl.policy import Policy
from fineflax.rl.step import make_rl_fns
from fineflax.rl.update import reuses_current_logp, rl_update, update_batch
from fineflax.train.loop import train_loop
from fineflax.train.model_setup import compute_dtype, setup_model
from fineflax.train.sections import Sections
from fineflax.train.optim import make_optimizer
from fineflax.train.sft_step import make_sft_fns
from fineflax.train.trainable import (export_trained, init_opt_state, init_placed_state, moment_dtype, pin_state,
                                     split_model)
from fineflax.train.workdir import finish_run


class Learner:
  """Base weights, train state, step and log-prob functions of one RL run (module docstring)."""

  def __init__(self, config, rl: RLConfig, *, mesh=None, rollout_mesh=None, guidance=None, replay=None,
               sections: Sections | None = None):
    """`sections`: the typed model/train/mesh sections built at resolve time (None: built from `config`)."""
    sections = Sections.of(config) if sections is None else sections
    self.config, self.rl, self.mesh, self.sections = config, rl, mesh, sections
    self.rollout_mesh = rollout_mesh if tp.tp_size(rollout_mesh) > 1 else None
    self.guidance, self.replay = guidance, replay
    self.objective = rl.objective_entry
    self.dtype = compute_dtype(sections.model)
    base, self.model_config, self.tok, self.lora_cfg, lora = setup_model(config, sections.model)
    # full training keeps its initial params frozen for the KL reference and a PPO critic's base
    self.trainable = split_model(sections.train, base, lora,
                                 keep_reference=rl.beta > 0 or bool(self.objective.critic)).place(mesh)
    self.base = self.trainable.base  # None in full training
    self.rollout_base = self._rollout_base()  # the base in the rollout mesh's layout (or self.base)
    self.scale = lora_lib.lora_scale(self.lora_cfg)
    self.optimizer = make_optimizer(config.optimizer, moment_dtype(sections.train))
    # one step per rollout batch without a plan: the step reads its own logp as old_logp (rl.old_logp="auto")
    self.on_policy = reuses_current_logp(rl, rl.num_iterations)
    self.step_fn, self.logp_fn = make_rl_fns(self.optimizer, objective=rl.objective,
                                             loss_kwargs=self.objective.kwargs(rl), fwd_kwargs=self.fwd_kwargs,
                                             skip_grad_bound=rl.skip_grad_bound, on_policy=self.on_policy,
                                             donate=self.trainable.donate)
    self.state = init_placed_state(self.trainable.params, self.optimizer, config.seed, mesh, self.trainable.full)
    self.critic = (Critic(rl.ppo, config.optimizer, fwd_kwargs=self.fwd_kwargs, donate=self.trainable.donate,
                          moment_dtype=moment_dtype(sections.train))
                   if self.objective.critic else None)
    if self.critic is not None:  # PPO: the value model is part of the train state (and its checkpoints)
      if rl.ppo.critic == "full" and sections.model.quant != "none":
        raise ConfigError(f"config.model.quant={sections.model.quant!r}: config.rl.ppo.critic='full' trains a copy "
                          "of a dense model; set config.model.quant=none or config.rl.ppo.critic=lora")
      critic_base = self.base if self.base is not None else self.trainable.reference
      self.state["critic"] = self.critic.init(critic_base, self.model_config, self.lora_cfg, config.seed)
    if mesh is not None:
      self.step_fn = pin_state(self.step_fn, self.state, self.trainable.donate)

  def _rollout_base(self):
    """The frozen base laid out for tensor-parallel rollouts on `rollout_mesh` (module docstring); the
    update's base without one (or in full training: the engine re-places the trained weights itself).
    ConfigError naming config.mesh.model when the model cannot be split over it."""
    if self.rollout_mesh is None:
      return self.base
    n = tp.tp_size(self.rollout_mesh)
    try:
      tp.check_tp(self.model_config, n)
      return None if self.base is None else tp.shard_decode_params(self.base, self.model_config, self.rollout_mesh)
    except ValueError as e:
      raise ConfigError(f"config.mesh.model={n}: {e}") from None

  @property
  def fwd_kwargs(self) -> dict:
    """The forward settings of `fineflax.rl.step.completion_logp` (the rollouts' temperature)."""
    m = self.sections.model
    return dict(model_config=self.model_config, lora_scale=self.scale, remat=m.remat, dtype=self.dtype,
                logits_chunk=m.logits_chunk, temperature=self.rl.temperature)

  def policy(self, params) -> Policy:
    """The policy of the trainable `params` (base + that LoRA, None: the base alone; or the full
    parameters themselves) with the run's sampling settings."""
    rl = self.rl
    weights, lora = self.trainable.weights(params)
    if self.rollout_mesh is not None and self.base is not None:
      weights = self.rollout_base
    return Policy(weights, self.model_config, self.tok, lora, self.scale, self.dtype, rl.temperature,
                  rl.top_p, rl.max_new_tokens, self.rollout_mesh or self.mesh, rl.dense_rollouts, rl.decode_impl)

  @functools.cached_property
  def pad_id(self) -> int:
    return self.policy(self.state["params"]).pad_id

  def mean_entropy(self, lora, prompt, trajectories, base=None) -> np.ndarray:
    """Mean token entropy of stored trajectories under the trainable `lora` (ExGRPO's trajectory selection)
    on `base` (default the learner's; a rollout group's copy when `lora` was copied there)."""
    comps = [t.tokens.tolist() for t in trajectories]
    batch = build_rl_batch([prompt.tolist()] * len(comps), comps, [[1.0] * len(c) for c in comps],
                           pad_id=self.pad_id, completion_width=round_up(self.rl.max_new_tokens, 32))
    _, ent = self.logp_fn(lora, self.base if base is None else base, batch)
    ent, mask = np.asarray(ent), batch["mask"]
    return (ent * mask).sum(1) / np.maximum(mask.sum(1), 1)

  def collect(self, lora, env, items, order, cursor: int, rng, reward_weights, *, policy=None,
              entropy_fn=None) -> Groups:
    """One step's scored groups of `env` under base + `lora`, with the guidance / replay rows; `policy` /
    `entropy_fn` replace the learner's own (an async run's rollout group: `fineflax.rl.async_rollouts`)."""
    return collect(env, self.policy(lora) if policy is None else policy, items, order, cursor, rng, self.rl,
                   reward_weights, guidance=self.guidance, replay=self.replay,
                   entropy_fn=functools.partial(self.mean_entropy, lora) if entropy_fn is None else entropy_fn)

  def groups_batch(self, groups: Groups) -> dict:
    """The update batch of the kept groups (`kept_groups`) with the fields the objective reads."""
    rl = self.rl
    return update_batch(groups.rows, groups.rewards, kept_groups(groups, rl), group_size=rl.group_size,
                        pad_id=self.pad_id, max_new_tokens=rl.max_new_tokens,
                        advantage_scale=rl.advantage_scale, fields=self.objective.batch_fields)

  @functools.cached_property
  def plan(self) -> UpdatePlan | None:
    """The update in mini-/micro-batches (`fineflax.rl.minibatch`) when rl.mini_batch_size splits the batch,
    rl.micro_batch_size / micro_batch_tokens is set or the objective has a critic; None: one step per
    iteration (rl_update)."""
    rl = self.rl
    if not (rl.mini_batch_size not in (0, rl.prompts_per_step) or rl.micro_batch_size or rl.micro_batch_tokens
            or self.critic):
      return None
    return UpdatePlan(rl, optimizer=self.optimizer, objective=rl.objective, loss_kwargs=self.objective.kwargs(rl),
                      fwd_kwargs=self.fwd_kwargs, logp_fn=self.logp_fn, pad_id=self.pad_id, critic=self.critic,
                      donate=self.trainable.donate)

  def update(self, state, batch: dict):
    """(new state, metrics of the last update): `fineflax.rl.update.rl_update` on this learner's base."""
    return rl_update(state, self.base, batch, step_fn=self.step_fn, logp_fn=self.logp_fn, beta=self.rl.beta,
                     num_iterations=self.rl.num_iterations, mesh=self.mesh, plan=self.plan,
                     reference=self.trainable.reference, on_policy=self.on_policy)

  @functools.cached_property
  def sft_fn(self):
    """The jitted SFT step (`fineflax.train.sft_step`) with this learner's optimizer and forward settings."""
    fwd = self.fwd_kwargs
    fwd.pop("temperature")
    fn = make_sft_fns(self.optimizer, donate=self.trainable.donate, **fwd)[0]
    return fn if self.mesh is None else pin_state(fn, self.state, self.trainable.donate)

  def sft_update(self, state, batch: dict):
    """(new state, metrics) of one SFT step on `batch` (placed on the mesh by the caller)."""
    return self.sft_fn(state, self.base, batch)

  def fresh_moments(self, state) -> dict:
    """`state` with the optimizer moments re-initialised (RL after the SFT phase starts from its params)."""
    return dict(state, opt_state=init_opt_state(state["params"], self.optimizer, self.mesh, self.trainable.full))


def train_and_export(job, config, workdir: str, *, desc: str, **summary_extra) -> dict:
  """`train_loop` over `job.hooks()` from `job.learner.state` for config.num_steps, then the run summary
  and the export (`finish_run` with `export_trained`, `summary_extra` added to the summary); the RL jobs' result
  {history, workdir, job, summary, exit_code}. The learner keeps the final state."""
  learner = job.learner
  result = train_loop(job.hooks(), learner.state, config, workdir, num_steps=config.num_steps, desc=desc,
                      eval_every=config.eval_every, eval_at_start=config.eval_at_start)
  learner.state = result.state
  export = lambda: export_trained(learner.trainable, learner.state["params"], lora_cfg=learner.lora_cfg,
                                  model_config=learner.model_config, tokenizer=learner.tok, config=config,
                                  workdir=workdir)
  summary = finish_run(workdir, result, export, **summary_extra)
  return {"history": result.history, "workdir": workdir, "job": job, "summary": summary,
          "exit_code": result.exit_code}
