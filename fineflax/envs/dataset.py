"""RL prompts from dataset files (or a hub dataset), single-turn rollouts, traces that travel with their row.

Config `config.dataset` (see configs/dataset_rl.py for every field):
  train, eval        local parquet / JSONL (a path, a glob, several joined by commas) or a hub dataset name
                     (online only; `split`); eval "" = no held-out evaluation
  format             the field map: luffy, search_r1, gsm8k, math (`fineflax.data.rl_prompts.FORMATS`) or custom
  fields             overrides of the map (question, messages, ground_truth, answer_rule, data_source,
                     source_name, target, reward_kwargs)
  system_prompt      a system turn added to prompts that have none ("" = none); assistant_prefix: text the
                     assistant turn starts with (part of the prompt; stripped from traces that start with it)
  on_bad_row         "error" (stop at the first unusable row, naming file, row and field) or "skip" (count
                     and name them); streaming / buffer_size: read rows in order (files larger than the disk
                     cache of `datasets`), shuffled in a buffer
  accuracy_reward    the registry reward that defines held-out accuracy (e.g. math, math_think, exact_match)
  num_eval           evaluation rows (0 = all); eval_n, eval_temperature, eval_top_p: completions per prompt
                     and their sampling settings (temperature 0 = greedy), for avg@n and pass@n
Training order: reshuffled every epoch, a function of the step (`fineflax.rl.order`), so a resumed run picks
up where it stopped. Rewards read the example {"ground_truth", "data_source", **reward kwargs}. LUFFY
guidance takes each row's trace (`target`); a row without one gets a group of on-policy samples.
"""
from __future__ import annotations

import jax
import numpy as np

from fineflax.config_checks import ConfigError, one_of, positive_int, require
from fineflax.data.rl_prompts import check_files, field_map, load_prompts
from fineflax.envs.arithmetic import trace_ids
from fineflax.envs.base import Env
from fineflax.stats import avg_at_n, pass_at_k
from fineflax.rewards import score_completions
from fineflax.rl import rows as R
from fineflax.rl.order import EpochOrder, StreamOrder
from fineflax.sampling import chat_prompt_ids


def fields_of(d) -> dict:
  """The field-map overrides of config.dataset.fields (empty strings and tuples mean "keep the format's")."""
  f = d.get("fields", None)
  return {k: v for k, v in (f.to_dict() if f is not None else {}).items() if v not in ("", (), [], None)}


def make_field_map(d):
  try:
    return field_map(d.format, **fields_of(d))
  except ValueError as e:
    raise ConfigError(f"config.dataset: {e}") from None


def _slug(name: str) -> str:
  return "".join(c if c.isalnum() else "_" for c in str(name)).strip("_") or "unknown"


class DatasetEnv(Env):
  """Training / evaluation rows of config.dataset and their single-turn rollouts and scoring."""

  eval_metric = "eval_accuracy"
  supports_replay = True  # not with dataset.streaming (checked at construction)

  @classmethod
  def validate(cls, config) -> None:
    """config.dataset's fields and a look at each local file's columns and first row (before weights load)."""
    from fineflax.rewards.registry import reward_names
    if "dataset" not in config:
      raise ConfigError("config.env='dataset' needs a config.dataset section (see configs/dataset_rl.py)")
    d = config.dataset
    require(config, "dataset.train", lambda v: isinstance(v, str) and v.strip(), "a file, glob or dataset name")
    one_of(config, "dataset.on_bad_row", ("error", "skip"))
    require(config, "dataset.accuracy_reward", lambda v: v in reward_names(),
            f"a registered reward ({', '.join(reward_names())})")
    positive_int(config, "dataset.eval_n")
    require(config, "dataset.eval_temperature", lambda v: v >= 0 and (v > 0 or d.eval_n == 1),
            ">= 0, and > 0 when dataset.eval_n > 1 (greedy completions would all be the same)")
    require(config, "dataset.num_eval", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0 (0 = all)")
    require(config, "dataset.buffer_size", lambda v: isinstance(v, int) and v >= 1, "an integer >= 1")
    if d.streaming and config.rl.objective in ("exgrpo",):
      raise ConfigError("config.dataset.streaming=True cannot replay old questions (ExGRPO); read the file "
                        "map-style (streaming=False)")
    fm = make_field_map(d)
    for key in ("train", "eval"):
      if d.get(key, ""):
        check_files(d[key], fm)

  def __init__(self, config, tokenizer):
    self.config, self.tok, self.d = config, tokenizer, config.dataset
    d = self.d
    self.field_map = make_field_map(d)
    self.train_items = load_prompts(d.train, self.field_map, on_bad_row=d.on_bad_row, streaming=d.streaming,
                                    split=d.get("split", "train"), seed=config.seed, buffer_size=d.buffer_size)
    self.eval_items = []
    if d.get("eval", ""):
      evals = load_prompts(d.eval, self.field_map, on_bad_row=d.on_bad_row, split=d.get("eval_split", "test"))
      n = d.num_eval or len(evals)
      self.eval_items = [evals[i] for i in range(min(n, len(evals)))]

  def train_order(self, seed: int):
    """Reshuffled every epoch (map-style), or the stream's own buffered shuffle."""
    if self.train_items.streaming:
      return StreamOrder(len(self.train_items))
    return EpochOrder(len(self.train_items), seed, reshuffle=True)

  def messages(self, item) -> list:
    sp = self.d.get("system_prompt", "")
    if sp and not any(m["role"] == "system" for m in item.messages):
      return [{"role": "system", "content": sp}, *item.messages]
    return item.messages

  def prompt(self, item) -> list[int]:
    return chat_prompt_ids(self.tok, self.messages(item), self.d.get("assistant_prefix", ""))

  def example(self, item) -> dict:
    return item.example()

  def rollout(self, policy, items, rng, mask_truncated: bool = False):
    """(rows, examples): one sampled completion per item."""
    prompts = [self.prompt(p) for p in items]
    rows = R.sampled_rows(prompts, policy.sample(prompts, rng), mask_truncated)
    return rows, [self.example(p) for p in items]

  def demonstrations(self, policy, items, texts=None):
    """Per item: (its trace row cut to the completion budget, example), or None when the row has no trace
    (texts[i], when given, replaces the row's own trace)."""
    out = []
    for i, p in enumerate(items):
      text = texts[i] if texts is not None and texts[i] is not None else p.target
      if text is None:
        out.append(None)
        continue
      ids = trace_ids(self.tok, text, policy.eos_id, self.d.get("assistant_prefix", ""))[:policy.max_new_tokens]
      out.append((R.fixed_row(self.prompt(p), ids, text), self.example(p)))
    return out

  def correct(self, items, texts) -> np.ndarray:
    """1.0 where the text earns `dataset.accuracy_reward` = 1 for its row."""
    total, _, _ = score_completions({self.d.accuracy_reward: 1.0}, [p.question for p in items], texts,
                                    [self.example(p) for p in items])
    return np.asarray(total, float)

  def evaluate(self, policy, items, prefix: str = "eval_") -> dict:
    """avg@n (`accuracy`) and, for n > 1, pass@n over the rows, overall and per data source
    (`accuracy_SOURCE`), and the mean completion length. n = dataset.eval_n completions per row, greedy when
    dataset.eval_temperature is 0, else sampled at it and eval_top_p (a fixed key per evaluation)."""
    if not items:
      return {}
    import dataclasses
    n, bs = int(self.d.eval_n), self.config.eval_batch_size
    greedy = float(self.d.eval_temperature) == 0.0
    sampler = dataclasses.replace(policy, temperature=float(self.d.eval_temperature) or 1.0,
                                  top_p=float(self.d.eval_top_p))
    rows = [p for p in items for _ in range(n)]
    per = max(bs // n, 1) * n  # whole rows per sampling call
    right, lengths = [], []
    for j, i in enumerate(range(0, len(rows), per)):
      chunk = rows[i:i + per]
      out = sampler.sample([self.prompt(p) for p in chunk], jax.random.PRNGKey(self.config.seed + 7919 * j),
                           greedy=greedy)
      right += list(self.correct(chunk, out.texts))
      lengths += list(out.lengths)
    right = np.asarray(right).reshape(len(items), n)
    metrics = {"accuracy": float(avg_at_n(right)), "completion_length": float(np.mean(lengths))}
    if n > 1:
      metrics[f"pass_at_{n}"] = float(pass_at_k(right, n).mean())
    sources = np.array([p.data_source for p in items])
    if len(set(sources)) > 1:
      for s in sorted(set(sources)):
        metrics[f"accuracy_{_slug(s)}"] = float(avg_at_n(right[sources == s]))
    return {prefix + k: v for k, v in metrics.items()}
