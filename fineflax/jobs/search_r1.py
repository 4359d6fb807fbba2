"""Search-R1 RL job: GRPO-family training of base+LoRA to reason with a search engine on a generated KB.

Each step: pick `prompts_per_step` training questions; roll out `group_size - n_off` rows per question
with the multi-turn search loop (`fineflax.search_r1.rollout`; inserted passages masked out of the loss);
LUFFY (`rl.objective="luffy"`) adds `n_off` demonstration rows per group: the question's correct searches
and answer, run through the same loop with the real engine (so their inserted text is real and masked).
Rewards: `search_r1_reward` (EM [+ format] [+ search bonus]); then the GRPO `Trainer.train_step`
(group advantages, old/ref log-probs, updates) with the completion budget `rl.max_new_tokens`.
Evaluation: greedy Search-R1 inference on held-out questions (EM overall / single-hop / two-hop).
"""
from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from fineflax.jobs.common import make_workdir
from fineflax.jobs.grpo import Trainer, export_run, train_loop
from fineflax.rl import groups as G
from fineflax.search_r1 import (RolloutConfig, ScriptedPolicy, Tags, make_kb, make_search_fn, prompt_ids,
                                rollout_batch, run_rollouts, search_r1_reward)


def rollout_config(config) -> RolloutConfig:
  s = config.search
  return RolloutConfig(max_turns=s.max_turns, max_turn_tokens=s.max_turn_tokens,
                       max_response_tokens=config.rl.max_new_tokens, max_obs_tokens=s.max_obs_tokens,
                       tags=Tags(info=s.info_tag))


def make_search_tool(config, documents):
  """The configured search function: an HTTP /retrieve server (search.url) or an in-process engine."""
  s = config.search
  if s.url:
    tool = s.url
  else:
    from retrieval import create_search_engine
    tool = create_search_engine(s.engine, documents)
  return make_search_fn(tool, topk=s.topk, timeout_s=s.timeout_s or None)


def result_rows(prompts, results, off_policy: bool) -> dict:
  """`fineflax.rl.groups` rows from rollout results (loss mask: 0 on inserted text)."""
  zeros = [[0.0] * len(r.tokens) for r in results]
  return {"prompt": [list(p) for p in prompts], "completion": [r.tokens for r in results],
          "loss_mask": [r.loss_mask for r in results], "text": [r.trace for r in results],
          "off_policy": [off_policy] * len(results), "behaviour_logp": zeros,
          "rollout_logp": zeros if off_policy else [r.logprobs for r in results]}


class SearchR1Trainer(Trainer):
  """The GRPO `Trainer` (model, jitted step, state, `train_step`) with Search-R1 rollouts and evaluation."""

  def __init__(self, config):
    if config.rl.objective not in ("grpo", "luffy"):
      raise ValueError(f"config.rl.objective={config.rl.objective!r}: search_r1 supports grpo or luffy")
    super().__init__(config)
    self.rollout_cfg = rollout_config(config)
    k = config.kb
    self.kb = make_kb(k.num_people, k.num_cities, k.num_countries, k.test_fraction, k.seed)
    self.search_fn = make_search_tool(config, self.kb.documents)

  eval_metric = "eval_em"

  def checkpoint_meta(self) -> dict:
    return {"config": self.config.to_dict()}

  def restore_meta(self, meta: dict) -> None:
    pass  # the state is all a Search-R1 run resumes from

  def eval_summary(self, m: dict) -> str:
    return f"held-out EM {m['eval_em']:.3f}, searches/question {m['eval_searches']:.2f}"

  def prompt(self, question) -> list[int]:
    return prompt_ids(self.tok, question.question, self.rollout_cfg)

  def search_rollouts(self, questions, lora, rng, greedy=False, n_per_question=1):
    rl = self.rl
    return rollout_batch(self.base, self.model_config, self.tok, self.search_fn,
                         [q.question for q in questions for _ in range(n_per_question)], self.rollout_cfg,
                         lora=lora, lora_scale=self.scale, temperature=0.0 if greedy else rl.temperature,
                         top_p=rl.top_p, rng=rng, dtype=self.dtype)

  def demonstrations(self, questions):
    """One demonstration rollout per question: its scripted correct turns with real search results."""
    policy = ScriptedPolicy(self.tok, [list(q.demo) for q in questions], eos_id=self.eos)
    cfg = dataclasses.replace(self.rollout_cfg, max_turn_tokens=self.rollout_cfg.max_response_tokens)
    return run_rollouts(policy, [self.prompt(q) for q in questions], self.search_fn, self.tok, cfg)

  def group_rollout(self, questions, rng):
    """(groups rows, rollout results) for len(questions) groups: on-policy rows, then n_off demos."""
    n_on = self.rl.group_size - self.n_off
    on = self.search_rollouts(questions, self.state["lora"], rng, n_per_question=n_on)
    demos = self.demonstrations(questions) if self.n_off else []
    rows, results = G.empty_rows(), []
    for g, q in enumerate(questions):
      p = self.prompt(q)
      part = on[g * n_on:(g + 1) * n_on]
      G.extend(rows, result_rows([p] * n_on, part, False))
      G.extend(rows, result_rows([p] * self.n_off, [demos[g]] * self.n_off, True))
      results += part + [demos[g]] * self.n_off
    return rows, results

  def rewards(self, questions, results):
    w = self.config.rewards
    golden = [[q.answer] for q in questions for _ in range(self.rl.group_size)]
    out = [search_r1_reward(r, g, em=w.em, format=w.format, search=w.search, tags=self.rollout_cfg.tags)
           for r, g in zip(results, golden)]
    return np.array([t for t, _ in out], np.float32), [p for _, p in out]

  def evaluate(self, questions) -> dict:
    """Greedy held-out EM (all, single-hop, two-hop), searches per question, format, finish shares."""
    results = []
    for i in range(0, len(questions), self.config.eval_batch_size):
      results += self.search_rollouts(questions[i:i + self.config.eval_batch_size], self.state["lora"],
                                      None, greedy=True)
    return search_metrics(questions, results, "eval_")


def search_metrics(questions, results, prefix: str) -> dict:
  """EM overall / by hops, mean searches, turns, completion length and answered share of rollouts."""
  em = np.array([search_r1_reward(r, [q.answer])[1]["em"] for q, r in zip(questions, results)])
  hops = np.array([q.hops for q in questions])
  out = {f"{prefix}em": float(em.mean()),
         f"{prefix}searches": float(np.mean([len(r.queries) for r in results])),
         f"{prefix}turns": float(np.mean([r.num_turns for r in results])),
         f"{prefix}answered": float(np.mean([r.finish == "answer" for r in results])),
         f"{prefix}completion_length": float(np.mean([len(r.tokens) for r in results]))}
  for h in (1, 2):
    if (hops == h).any():
      out[f"{prefix}em_{h}hop"] = float(em[hops == h].mean())
  return out


def held_out(kb, num: int, seed: int):
  """`num` held-out questions, half single-hop and half two-hop where possible (deterministic)."""
  test = kb.split("test")
  rng = np.random.default_rng(seed)
  one = [test[i] for i in rng.permutation(len(test)) if test[i].hops == 1]
  two = [test[i] for i in rng.permutation(len(test)) if test[i].hops == 2]
  k = min(num // 2, len(two))
  return two[:k] + one[:num - k]


def run(config, workdir: str | None) -> dict:
  workdir = make_workdir(config, workdir)
  rl = config.rl
  tr = SearchR1Trainer(config)
  train, evals = tr.kb.split("train"), held_out(tr.kb, config.num_eval, config.seed + 100)
  order = np.random.default_rng(config.seed).permutation(len(train))
  rng = jax.random.PRNGKey(config.seed + 7)

  def step_scalars(step: int) -> dict:
    t0 = time.time()
    cursor = (step - 1) * rl.prompts_per_step
    questions = [train[int(order[(cursor + i) % len(order)])] for i in range(rl.prompts_per_step)]
    rows, results = tr.group_rollout(questions, jax.random.fold_in(rng, step))
    rewards, parts = tr.rewards(questions, results)
    t_roll = time.time() - t0
    metrics = tr.train_step(rows, rewards, np.ones(len(questions), bool))
    on = ~np.asarray(rows["off_policy"])
    on_results = [r for r, o in zip(results, on) if o]
    return {**metrics, "reward_mean": float(rewards[on].mean()), "reward_std": float(rewards[on].std()),
            **{f"reward_{k}": float(np.mean([p[k] for p, o in zip(parts, on) if o])) for k in parts[0]},
            "searches": float(np.mean([len(r.queries) for r in on_results])),
            "turns": float(np.mean([r.num_turns for r in on_results])),
            "invalid_actions": float(np.mean([r.num_invalid for r in on_results])),
            "search_failures": float(np.sum([r.num_search_failures for r in on_results])),
            "completion_length": float(np.mean([len(r.tokens) for r in on_results])),
            "time_rollout_s": t_roll, "time_update_s": time.time() - t0 - t_roll}

  history = train_loop(tr, workdir, evals, step_scalars, desc=f"search_r1/{rl.objective}",
                       eval_at_start=config.eval_at_start)
  export_run(tr, config, workdir, history)
  return {"history": history, "workdir": workdir, "trainer": tr, "held_out": evals}
