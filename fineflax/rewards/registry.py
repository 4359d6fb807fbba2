"""Reward registry and batch scoring.

Every reward is `fn(prompt: str, completion: str, **example) -> float`, `example` being the dataset row's
fields (`answer`, `ground_truth`, `golden_answers`, `tests`, `tools`/`functions`, ...).

score_completions: total_i = sum_f w_f * r_f(prompt_i, completion_i, **example_i). A reward that raises (or
returns a non-finite / non-numeric value) scores 0 for that item, is logged with its traceback and counted
in `errors[f]`; nothing raises out, except a `RewardSetupError` (the reward cannot run at all here, e.g.
the code sandbox cannot start): that is a configuration error and stops scoring with its message.

Rewards defined outside `fineflax.rewards` are named in `PROVIDERS` (reward name -> the module that
registers it) and imported on first use by name (`get_reward`), so a reward is found whatever was imported
before; `reward_names()` lists the registered and the provided ones.
"""
from __future__ import annotations

import concurrent.futures
import importlib
import logging
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from fineflax.config_checks import require
from fineflax.rewards.errors import RewardSetupError

RewardFn = Callable[..., float]
REWARDS: dict[str, RewardFn] = {}
PROVIDERS: dict[str, str] = {name: "fineflax.search_r1.rewards"
                             for name in ("search_r1_em", "search_r1_format", "search_r1_searched")}
_log = logging.getLogger(__name__)


def register(name: str) -> Callable[[RewardFn], RewardFn]:
  """Decorator: `@register("math")` adds the function to REWARDS under `name` (duplicates are an error)."""
  def wrap(fn: RewardFn) -> RewardFn:
    if name in REWARDS and REWARDS[name] is not fn:
      raise ValueError(f"reward {name!r} is already registered ({REWARDS[name].__module__})")
    REWARDS[name] = fn
    return fn
  return wrap


def reward_names() -> list[str]:
  """Every reward name `get_reward` resolves: registered ones and those of `PROVIDERS`, sorted."""
  return sorted(set(REWARDS) | set(PROVIDERS))


def get_reward(name: str) -> RewardFn:
  """The reward registered as `name`, importing its providing module first when it is in `PROVIDERS`."""
  if name not in REWARDS and name in PROVIDERS:
    importlib.import_module(PROVIDERS[name])
  try:
    return REWARDS[name]
  except KeyError:
    raise KeyError(f"unknown reward {name!r}; available: {reward_names()}") from None


def check_reward_names(config, key: str = "rewards") -> None:
  """ConfigError naming config.KEY.NAME unless every name of the mapping config.KEY is a reward."""
  known = reward_names()
  for name in config[key]:
    require(config, f"{key}.{name}", lambda _: name in known,
            f"unknown reward {name!r}; registered: {', '.join(known)}")


def _score_one(name: str, fn: RewardFn, prompt: str, completion: str, example: Mapping) -> tuple[float, bool]:
  try:
    value = float(fn(prompt, completion, **example))
    if not math.isfinite(value):
      raise ValueError(f"reward {name!r} returned non-finite value {value}")
    return value, False
  except RewardSetupError:
    raise
  except Exception:  # a reward must never stop training: log, count, score 0
    _log.exception("reward %r failed on completion %.80r", name, completion)
    return 0.0, True


def score_completions(reward_weights: Mapping[str, float], prompts: Sequence[str], completions: Sequence[str],
                      examples: Sequence[Mapping] | None = None, *, max_workers: int = 1
                      ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, int]]:
  """Weighted sum of rewards -> (total [N] float32, per_fn {name: [N] unweighted}, errors {name: count}).

  `max_workers > 1` scores items on a thread pool (useful for `code`, whose work is in subprocesses).
  Unknown reward names and mismatched lengths are caller bugs and raise before any scoring.
  """
  n = len(completions)
  examples = [{}] * n if examples is None else examples
  if len(prompts) != n or len(examples) != n:
    raise ValueError(f"score_completions: {len(prompts)} prompts, {n} completions, {len(examples)} examples")
  fns = {name: get_reward(name) for name in reward_weights}
  jobs = [(name, i) for name in fns for i in range(n)]

  def run(job):
    name, i = job
    return _score_one(name, fns[name], prompts[i], completions[i], examples[i])

  if max_workers > 1 and len(jobs) > 1:
    with concurrent.futures.ThreadPoolExecutor(max_workers) as pool:
      results = list(pool.map(run, jobs))
  else:
    results = [run(job) for job in jobs]
  per_fn = {name: np.zeros(n, np.float32) for name in fns}
  errors = {name: 0 for name in fns}
  for (name, i), (value, failed) in zip(jobs, results):
    per_fn[name][i] = value
    errors[name] += int(failed)
  total = np.zeros(n, np.float32)
  for name, weight in reward_weights.items():
    total += np.float32(weight) * per_fn[name]
  return total, per_fn, errors
