"""Reasoning with search at inference time: a model (+ optional LoRA) answers questions, searching as needed.

  rws = ReasoningWithSearch(params, config, tokenizer, engine_or_url, lora=lora, lora_scale=2.0)
  r = rws.reason("In which country is the city where Ada Vor was born?")
  r.answer, r.queries, r.trace
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp

from fineflax.search_r1.policy import SamplerPolicy
from fineflax.search_r1.rollout import RolloutConfig, RolloutResult, prompt_ids, run_rollouts, session_length
from fineflax.search_r1.tools import make_search_fn


@dataclasses.dataclass
class ReasoningResult:
  answer: str | None
  trace: str
  queries: list[str]
  num_turns: int = 0
  finish: str = ""


def rollout_batch(params, config, tokenizer, search_fn, questions: Sequence[str], rollout: RolloutConfig, *,
                  lora=None, lora_scale: float = 1.0, temperature: float = 0.0, top_p: float = 1.0,
                  rng=None, dtype=jnp.bfloat16, mesh=None, dense_base: bool = False,
                  impl: str | None = "auto") -> list[RolloutResult]:
  """Rollouts of base+LoRA (SamplerPolicy) for the questions, one row each, in one batch; with `mesh`
  the rows and KV cache are split over its devices; dense_base / impl as `fineflax.sampling.SamplerSession`."""
  policy = SamplerPolicy(params, config, tokenizer, max_total_len=session_length(rollout),
                         temperature=temperature, top_p=top_p, rng=rng, lora=lora, lora_scale=lora_scale,
                         dtype=dtype, mesh=mesh, dense_base=dense_base, impl=impl)
  prompts = [prompt_ids(tokenizer, q, rollout) for q in questions]
  return run_rollouts(policy, prompts, search_fn, tokenizer, rollout)


class ReasoningWithSearch:
  """Greedy (temperature 0 by default) Search-R1 inference over an engine, a /retrieve URL or a callable."""

  def __init__(self, params, config, tokenizer, engine, *, lora=None, lora_scale: float = 1.0,
               rollout: RolloutConfig = RolloutConfig(), topk: int = 3, search_timeout_s: float | None = 30.0,
               temperature: float = 0.0, seed: int = 0, batch_size: int = 32, dtype=jnp.bfloat16):
    self.params, self.config, self.tokenizer = params, config, tokenizer
    self.search_fn = make_search_fn(engine, topk=topk, timeout_s=search_timeout_s)
    self.lora, self.lora_scale, self.rollout = lora, lora_scale, rollout
    self.temperature, self.batch_size, self.dtype = temperature, batch_size, dtype
    self.rng = jax.random.key(seed)

  def reason_batch(self, questions: Sequence[str]) -> list[ReasoningResult]:
    out = []
    for i in range(0, len(questions), self.batch_size):
      self.rng, key = jax.random.split(self.rng)
      rows = rollout_batch(self.params, self.config, self.tokenizer, self.search_fn,
                           questions[i:i + self.batch_size], self.rollout, lora=self.lora,
                           lora_scale=self.lora_scale, temperature=self.temperature, rng=key,
                           dtype=self.dtype)
      out += [ReasoningResult(r.answer, r.trace, r.queries, r.num_turns, r.finish) for r in rows]
    return out

  def reason(self, question: str) -> ReasoningResult:
    return self.reason_batch([question])[0]
