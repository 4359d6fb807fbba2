"""RL environments (task plug-ins) picked by name from `config.env`.

An environment owns its prompts, rollouts, reward inputs and evaluation:
  train_items / eval_items                  lists of items with `.question` (and whatever else it needs)
  prompt(item) -> token ids
  example(item) -> dict                     the fields registry rewards read (e.g. {"answer": ...})
  rollout(policy, items, rng, mask_truncated) -> (rows, examples)   one on-policy row per item
  demonstrations(policy, items, texts=None) -> [(row, example)]     LUFFY guidance rows
  evaluate(policy, items) -> metrics        contains `eval_metric`
  rollout_metrics(examples) -> metrics      extra per-step metrics of on-policy rollouts
  eval_metric: str; supports_replay: bool   (ExGRPO needs `example` of a replayed row)
  validate(config) (classmethod)            checks at resolve time (`fineflax.envs.base.Env`: every env
                                            subclasses it), e.g. its config section, the packages it needs
Optional too: train_order(seed) -> order[k] for k >= 0 (`fineflax.rl.order`; default: one permutation
repeated every epoch), evaluate_all(policy).
"""
from __future__ import annotations

import importlib

from fineflax.config_checks import ConfigError

ENVS = {"arithmetic": "fineflax.envs.arithmetic:ArithmeticEnv",
        "dataset": "fineflax.envs.dataset:DatasetEnv",
        "search_r1": "fineflax.envs.search_r1:SearchR1Env"}


def get_env_class(name: str):
  if name not in ENVS:
    raise ConfigError(f"config.env={name!r}: choose one of {', '.join(map(repr, ENVS))}")
  module, cls = ENVS[name].split(":")
  return getattr(importlib.import_module(module), cls)


def make_env(config, tokenizer):
  return get_env_class(config.env)(config, tokenizer)
