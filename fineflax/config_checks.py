"""Checks of config values at resolve time: each failure names the key, the value and what is allowed."""
from __future__ import annotations

from typing import Any, Callable, Iterable


class ConfigError(ValueError):
  """A config field holds a value outside its domain (raised before any model is loaded)."""


def lookup(config, key: str, default: Any = KeyError) -> Any:
  """config["a"]["b"] for key "a.b"; `default` when a part is missing (KeyError: raise)."""
  node = config
  for part in key.split("."):
    try:
      node = node[part]
    except (KeyError, TypeError):
      if default is KeyError:
        raise ConfigError(f"config.{key} is missing") from None
      return default
  return node


def require(config, key: str, ok: Callable[[Any], bool], allowed: str) -> None:
  """Raise ConfigError "config.KEY=VALUE: ALLOWED" unless ok(value); absent keys are not checked."""
  value = lookup(config, key, None)
  if value is None:
    return
  try:
    good = bool(ok(value))
  except (TypeError, ValueError):
    good = False
  if not good:
    raise ConfigError(f"config.{key}={value!r}: {allowed}")


def one_of(config, key: str, choices: Iterable[str]) -> None:
  choices = tuple(choices)
  require(config, key, lambda v: v in choices, f"choose one of {', '.join(map(repr, choices))}")


def positive_int(config, key: str) -> None:
  require(config, key, lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
          "must be a positive integer")


def in_range(config, key: str, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> None:
  def ok(v):
    v = float(v)
    return (lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)
  left, right = "(" if lo_open else "[", ")" if hi_open else "]"
  require(config, key, ok, f"must be in {left}{lo}, {hi}{right}")
