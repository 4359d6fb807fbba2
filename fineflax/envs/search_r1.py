"""Search-R1 as an RL environment: multi-turn rollouts with a search engine over a generated knowledge base.

Config: `config.kb` (the fictional knowledge base), `config.search` (engine or /retrieve URL, top-k, turn
and observation budgets, info tag, mask_info), `config.num_eval` held-out questions (half two-hop).
Inserted passages are masked out of the loss (`search.mask_info`; False is the paper's ablation).
Rewards come from `config.rewards` (registry names, e.g. search_r1_em / search_r1_format /
search_r1_searched) with the example {"answer": [golden], "rollout"}. Demonstrations (LUFFY guidance)
are each question's scripted correct searches and answer, run through the same loop with the real
engine, so their inserted text is real and masked.
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np

from fineflax.config_checks import require
from fineflax.envs.base import Env
from fineflax.rewards.qa import exact_match_score
from fineflax.rl import rows as R
from fineflax.search_r1 import (RolloutConfig, ScriptedPolicy, Tags, make_kb, make_search_fn, prompt_ids,
                                rollout_batch, run_rollouts)


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


def held_out(kb, num: int, seed: int):
  """`num` held-out questions, half single-hop and half two-hop where possible (deterministic)."""
  test = kb.split("test")
  rng = np.random.default_rng(seed)
  one = [test[i] for i in rng.permutation(len(test)) if test[i].hops == 1]
  two = [test[i] for i in rng.permutation(len(test)) if test[i].hops == 2]
  k = min(num // 2, len(two))
  return two[:k] + one[:num - k]


def result_rows(prompts, results, off_policy: bool, mask_truncated: bool = False,
                mask_info: bool = True) -> dict:
  """Rows from rollout results: loss mask 0 on inserted text (1 everywhere with mask_info=False, the
  paper's no-masking ablation); all 0 for a truncated row when `mask_truncated`. Traces carry no
  rollout log-probs."""
  masks = [[0.0] * len(r.tokens) if mask_truncated and r.finish == "length"
           else (r.loss_mask if mask_info else [1.0] * len(r.tokens)) for r in results]
  return R.make_rows(prompts, [r.tokens for r in results], masks, [r.trace for r in results],
                     off_policy=off_policy, rollout_logp=None if off_policy else [r.logprobs for r in results])


def em_metrics(questions, answers, prefix: str) -> dict:
  """EM (SQuAD-normalised exact match with the golden answer; None never matches) overall and by hops."""
  em = np.array([exact_match_score(a, [q.answer]) for q, a in zip(questions, answers)], float)
  hops = np.array([q.hops for q in questions])
  out = {f"{prefix}em": float(em.mean())}
  out.update({f"{prefix}em_{h}hop": float(em[hops == h].mean()) for h in (1, 2) if (hops == h).any()})
  return out


def search_metrics(questions, results, prefix: str) -> dict:
  """EM overall / by hops, mean searches (overall / by hops), turns, completion length and answered share
  of rollouts."""
  hops = np.array([q.hops for q in questions])
  searches = np.array([len(r.queries) for r in results])
  out = {**em_metrics(questions, [r.answer for r in results], prefix),
         f"{prefix}searches": float(np.mean([len(r.queries) for r in results])),
         f"{prefix}turns": float(np.mean([r.num_turns for r in results])),
         f"{prefix}answered": float(np.mean([r.finish == "answer" for r in results])),
         f"{prefix}completion_length": float(np.mean([len(r.tokens) for r in results]))}
  out.update({f"{prefix}searches_{h}hop": float(searches[hops == h].mean()) for h in (1, 2) if (hops == h).any()})
  return out


def most_frequent(answers) -> str:
  """The most frequent answer (ties: the alphabetically first)."""
  counts = collections.Counter(answers)
  top = max(counts.values())
  return min(a for a, c in counts.items() if c == top)


class SearchR1Env(Env):
  """Knowledge base, search tool and rollout settings of one Search-R1 run."""

  eval_metric = "eval_em"
  supports_replay = False  # a replayed row has no rollout result for the Search-R1 rewards

  @classmethod
  def validate(cls, config) -> None:
    """What the config needs installed (the in-process engine's packages unless search.url is set); no
    LUFFY traces file (demonstrations are scripted from the knowledge base)."""
    from fineflax.extras import require_search_engine
    require_search_engine(config)
    require(config, "rl.luffy.traces_path", lambda v: not v,
            "'' (search_r1 demonstrations are scripted from the knowledge base; a traces file is not supported)")

  def __init__(self, config, tokenizer):
    self.config, self.tok = config, tokenizer
    self.rollout_cfg = rollout_config(config)
    k = config.kb
    self.kb = make_kb(k.num_people, k.num_cities, k.num_countries, k.test_fraction, k.seed)
    self.search_fn = make_search_tool(config, self.kb.documents)
    self.train_items = self.kb.split("train")
    self.eval_items = held_out(self.kb, config.num_eval, config.seed + 100)

  def prompt(self, item) -> list[int]:
    return prompt_ids(self.tok, item.question, self.rollout_cfg)

  def results(self, policy, items, rng, greedy: bool = False):
    """One `RolloutResult` per item from the policy's multi-turn rollouts."""
    return rollout_batch(policy.base, policy.model_config, self.tok, self.search_fn,
                         [q.question for q in items], self.rollout_cfg, lora=policy.lora,
                         lora_scale=policy.lora_scale, temperature=0.0 if greedy else policy.temperature,
                         top_p=policy.top_p, rng=rng, dtype=policy.dtype, mesh=policy.mesh,
                         dense_base=policy.dense_base, impl=policy.decode_impl)

  def rollout(self, policy, items, rng, mask_truncated: bool = False):
    """(rows, examples): one multi-turn rollout per item."""
    results = self.results(policy, items, rng)
    rows = result_rows([self.prompt(q) for q in items], results, False, mask_truncated,
                       self.config.search.get("mask_info", True))
    return rows, [{"answer": [q.answer], "rollout": r} for q, r in zip(items, results)]

  def demonstrations(self, policy, items, texts=None):
    """One demonstration rollout per item: its scripted correct turns with real search results."""
    assert texts is None or all(t is None for t in texts), "no traces file (SearchR1Env.validate)"
    script = ScriptedPolicy(self.tok, [list(q.demo) for q in items], eos_id=policy.eos_id)
    cfg = dataclasses.replace(self.rollout_cfg, max_turn_tokens=self.rollout_cfg.max_response_tokens)
    results = run_rollouts(script, [self.prompt(q) for q in items], self.search_fn, self.tok, cfg)
    mask_info = self.config.search.get("mask_info", True)
    return [(result_rows([self.prompt(q)], [r], True, mask_info=mask_info),
             {"answer": [q.answer], "rollout": r}) for q, r in zip(items, results)]

  def evaluate(self, policy, items) -> dict:
    """Greedy held-out EM (all, single-hop, two-hop), searches per question, format, finish shares."""
    results, bs = [], self.config.eval_batch_size
    for i in range(0, len(items), bs):
      results += self.results(policy, items[i:i + bs], None, greedy=True)
    return search_metrics(items, results, "eval_")

  def no_model_baselines(self) -> dict[str, dict]:
    """Answers without a model, scored like `evaluate` (EM overall and by hops) on the held-out questions:
    constant = always the most frequent answer of the training questions; prior = per question kind, the
    most frequent answer of that kind's training questions (what the knowledge base's training facts
    predict without reading the held-out entity's passages)."""
    train, items = self.train_items, self.eval_items
    constant = most_frequent(q.answer for q in train)
    by_kind = {k: most_frequent(q.answer for q in train if q.kind == k) for k in {q.kind for q in train}}
    return {"constant": {**em_metrics(items, [constant] * len(items), "eval_"), "answer": constant},
            "prior": em_metrics(items, [by_kind.get(q.kind) for q in items], "eval_")}

  def rollout_metrics(self, examples) -> dict:
    """Searches, turns, invalid actions and failed searches of the step's on-policy rollouts."""
    rs = [e["rollout"] for e in examples]
    return {"searches": float(np.mean([len(r.queries) for r in rs])),
            "turns": float(np.mean([r.num_turns for r in rs])),
            "invalid_actions": float(np.mean([r.num_invalid for r in rs])),
            "search_failures": float(np.sum([r.num_search_failures for r in rs]))}
