"""Reward errors that are not a property of one completion (no dependencies: the sandbox imports this)."""


class RewardSetupError(RuntimeError):
  """A reward cannot run in this environment (e.g. the code sandbox cannot start); never scored as 0."""
