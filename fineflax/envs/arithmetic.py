"""Arithmetic word problems as an RL environment: chat prompts, single-turn rollouts, solver traces.

Config (`config.task`): num_train / num_eval problems, num_steps (operations per problem), max_start /
max_addend (number sizes), eval_seed, system_prompt, assistant_prefix (prefilled), accuracy_reward
(the registry reward that defines held-out accuracy). Rewards of rollouts come from `config.rewards`
(registry names -> weights) with the example {"answer": str(problem.answer)}.
"""
from __future__ import annotations

import numpy as np

from fineflax.envs.word_problems import Problem, generate_problems
from fineflax.rewards import score_completions
from fineflax.rl import rows as R
from fineflax.sampling import format_chat


def prompt_ids(tokenizer, system_prompt: str, question: str, assistant_prefix: str = "") -> list[int]:
  """Chat-formatted system + user turns, the assistant header, then `assistant_prefix` (prefilled)."""
  messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]
  return tokenizer(format_chat(tokenizer, messages) + assistant_prefix, add_special_tokens=False)["input_ids"]


def trace_ids(tokenizer, solution: str, eos_id: int, assistant_prefix: str = "") -> list[int]:
  """An off-policy trace as completion tokens: the worked solution (less the prefilled
  `assistant_prefix` it starts with, if any), then end of turn."""
  if assistant_prefix and solution.startswith(assistant_prefix):
    solution = solution[len(assistant_prefix):]
  return tokenizer(solution, add_special_tokens=False)["input_ids"] + [eos_id]


class ArithmeticEnv:
  """Generated problems (train split shuffled by the run, a disjoint held-out split) and their scoring."""

  eval_metric = "eval_accuracy"
  supports_replay = True

  def __init__(self, config, tokenizer):
    self.task, self.tok, self.config = config.task, tokenizer, config
    t = config.task
    sizes = dict(max_start=t.max_start, max_addend=t.max_addend)
    self.train_items: list[Problem] = generate_problems(t.num_train, "train", tuple(t.num_steps), config.seed,
                                                        **sizes)
    self.eval_items: list[Problem] = generate_problems(t.num_eval, "test", tuple(t.num_steps), t.eval_seed,
                                                       **sizes)

  def prompt(self, item: Problem) -> list[int]:
    return prompt_ids(self.tok, self.task.system_prompt, item.question, self.task.assistant_prefix)

  def example(self, item: Problem) -> dict:
    """The fields reward functions read for this problem."""
    return {"answer": str(item.answer)}

  def rollout(self, policy, items, rng, mask_truncated: bool = False):
    """(rows, examples): one sampled completion per item."""
    prompts = [self.prompt(p) for p in items]
    rows = R.sampled_rows(prompts, policy.sample(prompts, rng), mask_truncated)
    return rows, [self.example(p) for p in items]

  def demonstrations(self, policy, items, texts=None):
    """One off-policy trace row per item (its worked solution, or texts[i] when given), cut to the
    completion budget: a list of (rows, example)."""
    out = []
    for i, p in enumerate(items):
      text = p.solution if texts is None or texts[i] is None else texts[i]
      ids = trace_ids(self.tok, text, policy.eos_id, self.task.assistant_prefix)[:policy.max_new_tokens]
      out.append((R.fixed_row(self.prompt(p), ids, text), self.example(p)))
    return out

  def evaluate(self, policy, items) -> dict:
    """Greedy held-out accuracy (reward `task.accuracy_reward` = 1), in batches of eval_batch_size."""
    correct, lengths = [], []
    bs = self.config.eval_batch_size
    for i in range(0, len(items), bs):
      chunk = items[i:i + bs]
      out = policy.sample([self.prompt(p) for p in chunk], None, greedy=True)
      total, _, _ = score_completions({self.task.accuracy_reward: 1.0}, [p.question for p in chunk],
                                      out.texts, [self.example(p) for p in chunk])
      correct += list(total)
      lengths += list(out.lengths)
    return {"eval_accuracy": float(np.mean(correct)), "eval_completion_length": float(np.mean(lengths))}

  def rollout_metrics(self, examples) -> dict:
    return {}
