"""The base of RL environments (`fineflax.envs`): what every environment has, and the resolve-time hook.

`Env.validate(config)` runs in `fineflax.jobs.resolve.validate`, before any weight loads: an environment
checks its own config section there and raises `ConfigError` naming the field, the value and the allowed
values (one line, exit 2 from launch.py). The default checks nothing.
"""
from __future__ import annotations


class Env:
  """An RL environment (the protocol is listed in `fineflax.envs`)."""

  eval_metric = "eval_accuracy"
  supports_replay = False  # ExGRPO replay needs `example(item)` of a replayed row

  @classmethod
  def validate(cls, config) -> None:
    """Checks of the environment's config fields at resolve time (ConfigError); none by default."""

  @classmethod
  def longest_prompt_tokens(cls, config) -> int | None:
    """Tokens of the longest training prompt (module doc); None: unknown before the run."""
    return None

  def rollout_metrics(self, examples) -> dict:
    """Extra per-step metrics of the on-policy rollouts' examples; none by default."""
    return {}
