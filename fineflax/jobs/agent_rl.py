"""Agent RL job: traced agent rollouts -> transitions -> group advantages -> the RL update, in `train.loop`.

Each step: `rl.prompts_per_step` tasks, `rl.group_size` rollouts each, run by `agent.num_workers` threads on
the in-process sampler (base + the current LoRA, `rl.temperature`; concurrent calls batched) and traced into
the store (WORKDIR/agent_store.sqlite unless `agent.store`). Every LLM call becomes a transition (state = its
prompt ids, action = its response ids) with the rollout's reward credited by `agent.credit` ("final" or
"discounted" with `agent.gamma`); advantages are grouped per task over all its transitions
(`fineflax.agents.transitions`); then old/ref log-probs and `rl.num_iterations` updates of the objective
(`fineflax.rl.update.rl_update`; any objective of the table without off-policy rows).
PPO (`rl.objective="ppo"`, preset `ppo`): as the RL job (`fineflax.rl.ppo`, `fineflax.rl.minibatch`), every
transition is a row whose credited reward is its score at its last token; the critic's values are per
token of the row, GAE runs over the row's completion tokens (a merged row's inserted tool text included:
Search-R1 reads `attention_mask` for GAE and the value loss) and the policy loss and the reward's KL read
only the agent's own tokens (`mask`; tool text 0, Search-R1's `info_mask`), so tool tokens get no policy
gradient. Rows padded for fewer compiles are out of GAE, whitening and the value loss (`response_mask` 0).
Evaluation: greedy rollouts of the held-out tasks; `eval_accuracy` = mean reward (the calculator agent's
reward is answer correctness).
"""
from __future__ import annotations

import os
import time

import jax
import numpy as np

from fineflax.agents import LocalLLM, Store, group_advantages, rollout_transitions, run_rollouts, transition_batch
from fineflax.agents.calculator import CalculatorAgent, calculator_tasks
from fineflax.agents.transitions import CREDITS, merge_transitions
from fineflax.config_checks import ConfigError, in_range, one_of, positive_int, require
from fineflax.envs.word_problems import generate_problems
from fineflax.extras import require_search_engine
from fineflax.jobs import resolve
from fineflax.rl.batch import pad_rows
from fineflax.rl.config import RLConfig
from fineflax.rl.learner import Learner, train_and_export
from fineflax.rl.ppo import response_mask
from fineflax.train.loop import Hooks, read_history
from fineflax.train.workdir import make_workdir, preflight

AGENTS = ("calculator", "search_r1")
ROW_BUCKET = 16  # transitions are padded with masked rows to a multiple of this (`pad_rows`; fewer compiles)


def make_agent(config, tokenizer=None, greedy: bool = False):
  """The configured agent; greedy=True: its evaluation variant (temperature 0)."""
  a = config.agent
  temperature = 0.0 if greedy else None
  if a.name == "search_r1":
    from fineflax.agents.search_r1 import SearchR1Agent
    from fineflax.envs.search_r1 import make_search_tool, rollout_config
    kb = search_kb(config)
    return SearchR1Agent(tokenizer, make_search_tool(config, kb.documents), rollout_config(config),
                         temperature=temperature, format_weight=config.search.format_weight)
  return CalculatorAgent(max_calls=a.max_calls, temperature=temperature)


def search_kb(config):
  from fineflax.search_r1 import make_kb
  k = config.kb
  return make_kb(k.num_people, k.num_cities, k.num_countries, k.test_fraction, k.seed)


def make_tasks(config):
  """(train tasks, held-out tasks): arithmetic word problems (`config.task`) or, for the search_r1 agent,
  questions of the generated knowledge base (`config.kb`; held-out half two-hop, as the search_r1 env)."""
  if config.agent.name == "search_r1":
    from fineflax.envs.search_r1 import held_out
    kb = search_kb(config)
    as_task = lambda q: {"question": q.question, "answer": q.answer}
    return [as_task(q) for q in kb.split("train")], [as_task(q) for q in held_out(kb, config.task.num_eval, config.seed + 100)]
  t = config.task
  sizes = dict(max_start=t.max_start, max_addend=t.max_addend)
  train = generate_problems(t.num_train, "train", tuple(t.num_steps), config.seed, **sizes)
  held_out = generate_problems(t.num_eval, "test", tuple(t.num_steps), t.eval_seed, **sizes)
  return calculator_tasks(train), calculator_tasks(held_out)


class AgentRLJob:
  """Wiring of one agent RL run: the learner (one device: the agents' LLM calls run on the in-process
  sampler), the agents, the tasks, the trace store; `step` is one step of `fineflax.train.loop`."""

  def __init__(self, config, rl: RLConfig | None = None):
    rl = RLConfig.from_config(config.rl) if rl is None else rl
    self.config, self.rl = config, rl
    self.learner = Learner(config, rl)
    self.agent = make_agent(config, self.learner.tok)
    self.eval_agent = make_agent(config, self.learner.tok, greedy=True)
    self.train_tasks, self.eval_tasks = make_tasks(config)
    self.order = np.random.default_rng(config.seed).permutation(len(self.train_tasks))
    self.rng = jax.random.PRNGKey(config.seed + 7)
    self.resources = {"prompt_template": config.agent.prompt_template}
    self.store = None

  def open_store(self, workdir: str) -> Store:
    self.store = Store(self.config.agent.store or os.path.join(workdir, "agent_store.sqlite"))
    try:
      current = self.store.resource("prompt_template")["value"]
    except KeyError:
      current = None
    if current != self.resources["prompt_template"]:
      self.store.add_resource("prompt_template", self.resources["prompt_template"], {"source": "config"})
    return self.store

  def rollouts(self, lora, tasks, rng, mode: str, group_ids=None, greedy: bool = False):
    llm = LocalLLM(self.learner.policy(lora), rng, max_rows=self.config.agent.max_batch)
    a = self.config.agent
    try:
      agent = self.eval_agent if greedy else self.agent
      recs = run_rollouts(agent, tasks, llm, self.resources, self.store, num_workers=a.num_workers,
                          max_attempts=a.max_attempts, mode=mode, group_ids=group_ids)
    finally:
      llm.close()
    return recs, llm.batch_sizes

  def step(self, state, step: int):
    rl, a, t0 = self.rl, self.config.agent, time.time()
    start = (step - 1) * rl.prompts_per_step
    qids = [int(self.order[(start + i) % len(self.order)]) for i in range(rl.prompts_per_step)]
    tasks = [self.train_tasks[q] for q in qids for _ in range(rl.group_size)]
    groups = [f"step{step}-task{q}" for q in qids for _ in range(rl.group_size)]
    recs, sizes = self.rollouts(state["params"], tasks, jax.random.fold_in(self.rng, step), "train", groups)
    t_roll = time.time() - t0
    ts = [t for r in recs for t in rollout_transitions(r, a.credit, a.gamma)]
    if a.merge:  # calls that continue each other -> one row per rollout, inserted text masked
      by_rollout: dict = {}
      for t in ts:
        by_rollout.setdefault(t.rollout_id, []).append(t)
      ts = [merge_transitions(v) for v in by_rollout.values()]
    if not ts:
      raise RuntimeError(f"step {step}: every rollout failed (see the attempts table of {self.store.path})")
    adv = group_advantages([t.reward for t in ts], [t.group_id for t in ts], rl.advantage_scale)
    batch = self.update_batch(ts, adv)
    sampler_logp = batch.pop("rollout_logp")
    state, metrics = self.learner.update(state, batch)
    rewards = np.array([r.reward for r in recs if r.reward is not None])
    spans = [s for r in recs for s in r.spans]
    tools = [s for s in spans if s.kind == "tool"]
    return state, {
        **metrics, "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
        "transitions": float(len(ts)),
        "calls_per_rollout": sum(s.kind == "llm" for s in spans) / max(len(rewards), 1),
        "failed_rollouts": float(sum(r.reward is None for r in recs)),
        "tool_errors": float(np.mean([str(s.attributes.get("result", "")).startswith("error") for s in tools]))
        if tools else 0.0,
        "zero_advantage_share": float(np.mean(adv == 0)), "mean_llm_batch": float(np.mean(sizes)),
        "response_length": float(np.mean([len(t.response_ids) for t in ts])),
        "sampler_logp_mean": float(sampler_logp.sum() / max(sum(len(t.response_ids) for t in ts), 1)),
        "time_rollout_s": t_roll, "time_update_s": time.time() - t0 - t_roll}

  def update_batch(self, ts, adv) -> dict:
    """The update batch of the transitions `ts` (`transition_batch`), padded to a multiple of ROW_BUCKET rows
    when the aggregation allows it. PPO: the group advantages `adv` are replaced by the critic's later
    (zeros here), the credited rewards go in `rewards` and `response_mask` is set before padding."""
    if self.learner.critic is not None:
      batch = transition_batch(ts, np.zeros(len(ts), np.float32), pad_id=self.learner.pad_id)
      batch["rewards"] = np.asarray([t.reward for t in ts], np.float32)
      batch["response_mask"] = response_mask(batch)  # padded rows get 0 (`pad_rows`)
    else:
      batch = transition_batch(ts, adv, pad_id=self.learner.pad_id)
    if self.rl.agg_mode in ("token-mean", "sum"):
      batch = pad_rows(batch, ROW_BUCKET)
    return batch

  def evaluate(self, state) -> dict:
    recs, _ = self.rollouts(state["params"], self.eval_tasks, self.rng, "eval", greedy=True)
    r = np.array([x.reward if x.reward is not None else 0.0 for x in recs])
    calls = [sum(s.kind == "llm" for s in x.spans) for x in recs]
    return {"eval_accuracy": float(r.mean()), "eval_calls": float(np.mean(calls))}

  def hooks(self) -> Hooks:
    return Hooks(step=self.step, evaluate=self.evaluate, eval_metric="eval_accuracy", eval_mode="max",
                 postfix=("reward_mean", "loss"))


def validate(config) -> RLConfig:
  """This job's part of `fineflax.jobs.resolve.validate`: config.rl (`RLConfig`; an objective without
  off-policy rows), the agent section, the task sizes and the run cadence. Returns the RLConfig."""
  rl = RLConfig.from_config(config.rl)
  obj = rl.objective_entry
  if obj.off_policy is not None:
    raise ConfigError(f"config.rl.objective={config.rl.objective!r} adds off-policy rows ({obj.off_policy}), "
                      "which agent rollouts do not have; choose an on-policy objective such as 'grpo'")
  require(config, "rl.mini_batch_size", lambda v: v in (0, rl.prompts_per_step),
          "must be 0 (one step a batch: agent groups hold varying numbers of transitions)")
  for key, why in (("dynamic_sampling", "agent groups are not refilled"),
                   ("mask_truncated", "not supported for agent calls"),
                   ("overlong_buffer", "not supported for agent calls"),
                   ("async_steps", "agent rollouts run synchronously")):
    require(config, f"rl.{key}", lambda v: not v, f"must be off ({why})")
  require(config, "rl.importance", lambda v: v in ("none", "auto"),
          "must be none or auto (agent batches carry no behaviour log-probs for the correction)")
  one_of(config, "agent.name", AGENTS)
  one_of(config, "agent.credit", CREDITS)
  require(config, "agent.merge", lambda v: isinstance(v, bool), "true or false")
  in_range(config, "agent.gamma", 0.0, 1.0)
  for key in ("agent.max_calls", "agent.num_workers", "agent.max_attempts", "agent.max_batch", "num_steps",
              "task.num_train", "task.num_eval"):
    positive_int(config, key)
  require(config, "agent.prompt_template", lambda v: isinstance(v, str) and v.strip(), "a non-empty string")
  if config.agent.name == "search_r1":
    for section in ("kb", "search"):
      if section not in config:
        raise ConfigError(f"config.{section} is missing: agent.name='search_r1' needs it (use the :search_r1 preset)")
    require_search_engine(config)
  return rl


def run(config, workdir: str | None) -> dict:
  rl = resolve.validate(config)
  done = preflight(config, workdir, config.num_steps)  # before the model loads
  if done is not None:
    return {"history": read_history(workdir), "workdir": workdir, "job": None, "summary": done, "exit_code": 0}
  job = AgentRLJob(config, rl)
  workdir = make_workdir(config, workdir)
  job.open_store(workdir)
  return train_and_export(job, config, workdir, desc=f"agent_rl/{config.agent.name}/{config.rl.objective}",
                          store=job.store.path)
