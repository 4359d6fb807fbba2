"""The Search-R1 agent as a plain agent function: the loop of `fineflax.search_r1.rollout.run_rollouts` (the
one implementation) for one question, its model turns asked of an OpenAI-style client at token level
(`llm.complete(token ids)`, `LLMPolicy`).

Each turn is one LLM call whose prompt is the question prompt + everything so far (model turns and inserted
passages, as token ids), so the spans' calls continue each other and `merge_transitions` rebuilds exactly the
built-in rollout row (tokens, loss mask 0 on inserted text, log-probs); `LocalLLM` resumes the previous
turn's KV pages instead of reading the context again. The search engine is a traced tool. Sampled (T > 0)
rollouts draw other random numbers than one batched `SamplerSession` (greedy rollouts are identical).
Reward: `search_r1_reward` (EM, + `format` / `search` weights).
"""
from __future__ import annotations

from fineflax.agents.tracing import tool
from fineflax.search_r1.policy import LLMPolicy  # noqa: F401 (its home was here; kept importable)
from fineflax.search_r1.rewards import search_r1_reward
from fineflax.search_r1.rollout import RolloutConfig, RolloutResult, prompt_ids, run_rollouts


class SearchR1Agent:
  """agent(task, llm, resources) -> reward; task = {"question": str, "answer": str}."""

  def __init__(self, tokenizer, search_fn, config: RolloutConfig = RolloutConfig(), *, temperature=None,
               format_weight: float = 0.0, search_weight: float = 0.0):
    self.tok, self.config, self.temperature = tokenizer, config, temperature
    self.weights = dict(format=format_weight, search=search_weight)
    self.search = tool(lambda queries: search_fn(queries), name="search")

  def run(self, question: str, llm) -> RolloutResult:
    """One rollout (the built-in loop's record for this row)."""
    policy = LLMPolicy(llm, self.tok, self.temperature)
    (row,) = run_rollouts(policy, [prompt_ids(self.tok, question, self.config)], self.search, self.tok,
                          self.config)
    return row

  def rollout(self, task, llm, resources) -> float:
    row = self.run(task["question"], llm)
    reward, _ = search_r1_reward(row, [task["answer"]], **self.weights, tags=self.config.tags)
    return reward
