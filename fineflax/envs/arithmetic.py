"""Arithmetic word problems as an RL environment: chat prompts, single-turn rollouts, solver traces.

Config (`config.task`): num_train / num_eval problems, num_steps (operations per problem), max_start /
max_addend (number sizes), eval_seed, system_prompt, assistant_prefix (prefilled), accuracy_reward
(the registry reward that defines held-out accuracy). Rewards of rollouts come from `config.rewards`
(registry names -> weights) with the example {"answer": str(problem.answer)}.

Evaluation sets (optional `config.task` fields, absent = the first default):
  eval_split     "test" (num_eval held-out problems of eval_seed) or "validation" (the next num_eval
                 held-out problems of the same generator: disjoint from test; tune on it, report test)
  ood_num_steps  e.g. (4, 5): also evaluate on that many operations (metrics eval_ood_ops_*); () = off
  ood_template   e.g. "box": also evaluate the same problems reworded (eval_ood_phrasing_*); "" = off
  pass_k         k > 0: also sample k completions per problem at pass_temperature; a problem passes
                 if any is right (eval_pass_at_k), plus the samples' mean accuracy, length and entropy
                 estimate (mean -log p of the sampled tokens); pass_k_items caps the problems (0 = all)
"""
from __future__ import annotations

import collections
import dataclasses

import jax
import numpy as np

from fineflax.config_checks import in_range, one_of, positive_int, require
from fineflax.envs.base import Env
from fineflax.envs.word_problems import MAX_VALUE, TEMPLATES, Problem, generate_problems
from fineflax.rewards import score_completions
from fineflax.rewards.registry import reward_names
from fineflax.rl import rows as R
from fineflax.sampling import chat_prompt_ids


def prompt_ids(tokenizer, system_prompt: str, question: str, assistant_prefix: str = "") -> list[int]:
  """Chat-formatted system + user turns, the assistant header, then `assistant_prefix` (prefilled)."""
  messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]
  return chat_prompt_ids(tokenizer, messages, assistant_prefix)


def trace_ids(tokenizer, solution: str, eos_id: int, assistant_prefix: str = "") -> list[int]:
  """An off-policy trace as completion tokens: the worked solution (less the prefilled
  `assistant_prefix` it starts with, if any), then end of turn."""
  if assistant_prefix and solution.startswith(assistant_prefix):
    solution = solution[len(assistant_prefix):]
  return tokenizer(solution, add_special_tokens=False)["input_ids"] + [eos_id]


def held_out(task, num_steps, sizes: dict, template: str = "default") -> list[Problem]:
  """`task.num_eval` held-out problems: the first num_eval of the eval_seed generator ("test"), or the
  next num_eval ("validation"), which never coincide with them (`ArithmeticEnv.validate` checks the split)."""
  split = task.get("eval_split", "test")
  n = task.num_eval
  problems = generate_problems(2 * n if split == "validation" else n, "test", num_steps, task.eval_seed,
                               template=template, **sizes)
  return problems[n:] if split == "validation" else problems


EVAL_SPLITS = ("test", "validation")


def _operation_counts(v, empty_ok: bool = False) -> bool:
  """An int in 1..5 or an inclusive range (lo, hi) with 1 <= lo <= hi <= 5 (() when empty_ok)."""
  counts = (v, v) if isinstance(v, int) else tuple(v)
  if not counts:
    return empty_ok
  return len(counts) == 2 and all(isinstance(n, int) for n in counts) and 1 <= counts[0] <= counts[1] <= 5


class ArithmeticEnv(Env):
  """Generated problems (train split shuffled by the run, a disjoint held-out split) and their scoring."""

  eval_metric = "eval_accuracy"
  supports_replay = True

  @classmethod
  def validate(cls, config) -> None:
    """config.task: the problem counts and sizes, the evaluation sets and the accuracy reward."""
    for key in ("task.num_train", "task.num_eval"):
      positive_int(config, key)
    require(config, "task.num_steps", _operation_counts, "an int in 1..5 or a range (lo, hi), 1 <= lo <= hi <= 5")
    require(config, "task.ood_num_steps", lambda v: _operation_counts(v, empty_ok=True),
            "() (off), an int in 1..5 or a range (lo, hi), 1 <= lo <= hi <= 5")
    in_range(config, "task.max_start", 2, MAX_VALUE)
    in_range(config, "task.max_addend", 1, MAX_VALUE)
    one_of(config, "task.eval_split", EVAL_SPLITS)
    one_of(config, "task.ood_template", ("", *TEMPLATES))
    require(config, "task.pass_k", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0 (0 = off)")
    require(config, "task.accuracy_reward", lambda v: v in reward_names(),
            f"a registered reward ({', '.join(reward_names())})")

  @staticmethod
  def _train_items(config) -> list[Problem]:
    t = config.task
    return generate_problems(t.num_train, "train", tuple(t.num_steps), config.seed, max_start=t.max_start,
                             max_addend=t.max_addend)

  @classmethod
  def longest_prompt_tokens(cls, config, candidates: int = 8) -> int | None:
    """The longest chat prompt of the training problems. A prompt is the template's tokens plus the question's
    (up to a token or two merged at the seams), so only the `candidates` questions with the most tokens of
    their own are formatted in full (formatting all 4000 takes seconds; tokenizing the questions ~0.1 s).
    None when the model's tokenizer is not on this machine (a dry run planning for a hub model offline)."""
    from fineflax.models import load_tokenizer
    try:
      tok = load_tokenizer(config.model.source)
    except (OSError, ValueError):
      return None
    questions = sorted({p.question for p in cls._train_items(config)})
    lengths = [len(ids) for ids in tok(questions, add_special_tokens=False)["input_ids"]]
    longest = [questions[i] for i in np.argsort(lengths)[::-1][:candidates]]
    t = config.task
    return max(len(prompt_ids(tok, t.system_prompt, q, t.assistant_prefix)) for q in longest)

  def __init__(self, config, tokenizer):
    self.task, self.tok, self.config = config.task, tokenizer, config
    t = config.task
    sizes = dict(max_start=t.max_start, max_addend=t.max_addend)
    self.train_items: list[Problem] = self._train_items(config)
    self.eval_items: list[Problem] = held_out(t, tuple(t.num_steps), sizes)
    self.extra_eval_sets: dict[str, list[Problem]] = {}
    if tuple(t.get("ood_num_steps", ()) or ()):
      self.extra_eval_sets["ood_ops"] = held_out(t, tuple(t.ood_num_steps), sizes)
    if t.get("ood_template", ""):
      self.extra_eval_sets["ood_phrasing"] = held_out(t, tuple(t.num_steps), sizes, t.ood_template)

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

  def correct(self, items, texts) -> np.ndarray:
    """1.0 where the text earns reward `task.accuracy_reward` = 1 for its problem."""
    total, _, _ = score_completions({self.task.accuracy_reward: 1.0}, [p.question for p in items], texts,
                                    [self.example(p) for p in items])
    return np.asarray(total, float)

  def evaluate(self, policy, items, prefix: str = "eval_") -> dict:
    """Greedy held-out accuracy (reward `task.accuracy_reward` = 1) and completion length, in batches of
    eval_batch_size; with `task.pass_k` also `pass_at_k` (module docstring)."""
    correct, lengths = [], []
    bs = self.config.eval_batch_size
    for i in range(0, len(items), bs):
      chunk = items[i:i + bs]
      out = policy.sample([self.prompt(p) for p in chunk], None, greedy=True)
      correct += list(self.correct(chunk, out.texts))
      lengths += list(out.lengths)
    metrics = {"accuracy": float(np.mean(correct)), "completion_length": float(np.mean(lengths))}
    if self.task.get("pass_k", 0):
      metrics.update(self.pass_at_k(policy, items))
    return {prefix + k: v for k, v in metrics.items()}

  def evaluate_all(self, policy) -> dict:
    """`evaluate` on the held-out set (eval_*) and on every extra set (eval_NAME_*)."""
    metrics = self.evaluate(policy, self.eval_items)
    for name, items in self.extra_eval_sets.items():
      metrics.update(self.evaluate(policy, items, f"eval_{name}_"))
    return metrics

  def pass_at_k(self, policy, items) -> dict:
    """k samples per problem at `task.pass_temperature` (fixed key: the same draws at every evaluation):
    pass_at_k = share of problems with >= 1 right sample; sample_accuracy, sample_length, and
    sample_entropy = mean over sampled tokens of -log p (a Monte-Carlo estimate of the per-token entropy
    of the tempered policy)."""
    t = self.task
    k, n = int(t.pass_k), int(t.get("pass_k_items", 0)) or len(items)
    items = items[:n]
    sampler = dataclasses.replace(policy, temperature=float(t.get("pass_temperature", 0.7)), top_p=1.0)
    rows = [p for p in items for _ in range(k)]
    bs = max(self.config.eval_batch_size // k, 1) * k  # rows per sampling call: whole problems
    right, lengths, nll, tokens = [], [], 0.0, 0
    for j, i in enumerate(range(0, len(rows), bs)):
      chunk = rows[i:i + bs]
      out = sampler.sample([self.prompt(p) for p in chunk], jax.random.PRNGKey(t.eval_seed + 7919 * j))
      right += list(self.correct(chunk, out.texts))
      lengths += list(out.lengths)
      mask = np.asarray(out.mask, bool)
      nll -= float(np.asarray(out.logprobs)[mask].sum())
      tokens += int(mask.sum())
    right = np.asarray(right).reshape(len(items), k)
    return {f"pass_at_{k}": float((right.max(1) > 0).mean()), "sample_accuracy": float(right.mean()),
            "sample_length": float(np.mean(lengths)), "sample_entropy": nll / max(tokens, 1)}

  def no_model_baselines(self) -> dict[str, dict]:
    """{"constant": metrics}: always answering the most frequent training answer (ties: the smallest),
    scored by `correct` on the held-out set and every extra set under `evaluate_all`'s names (accuracy;
    with `task.pass_k` also pass@k, which for a constant answer equals its accuracy); "answer" is it."""
    counts = collections.Counter(p.answer for p in self.train_items)
    top = max(counts.values())
    answer = min(a for a, c in counts.items() if c == top)
    metrics = {"answer": answer}
    for prefix, items in (("eval_", self.eval_items), *((f"eval_{n}_", v) for n, v in self.extra_eval_sets.items())):
      acc = float(np.mean(self.correct(items, [f"<answer>{answer}</answer>"] * len(items))))
      metrics[f"{prefix}accuracy"] = acc
      if self.task.get("pass_k", 0):
        metrics[f"{prefix}pass_at_{int(self.task.pass_k)}"] = acc
    return {"constant": metrics}
