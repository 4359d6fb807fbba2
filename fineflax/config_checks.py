"""Checks of config values at resolve time: each failure names the key, the value and what is allowed.

A rule is a pair (ok(value) -> bool, allowed: str); `check` applies one to a value (typed configs such as
`fineflax.rl.config.RLConfig` call it in `__post_init__`), `require` to a key of a ConfigDict.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

Rule = tuple[Callable[[Any], bool], str]


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


def check(key: str, value: Any, ok: Callable[[Any], bool], allowed: str) -> None:
  """Raise ConfigError "config.KEY=VALUE: ALLOWED" unless ok(value) (an ok that raises TypeError or
  ValueError counts as False)."""
  try:
    good = bool(ok(value))
  except (TypeError, ValueError):
    good = False
  if not good:
    raise ConfigError(f"config.{key}={value!r}: {allowed}")


def require(config, key: str, ok: Callable[[Any], bool], allowed: str) -> None:
  """`check` of config's KEY ("a.b"); absent keys are not checked."""
  value = lookup(config, key, None)
  if value is not None:
    check(key, value, ok, allowed)


def choice(choices: Iterable[str]) -> Rule:
  choices = tuple(choices)
  return (lambda v: v in choices), f"choose one of {', '.join(map(repr, choices))}"


def positive_integer() -> Rule:
  """An int > 0 (bools excluded)."""
  return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0), "must be a positive integer"


def non_negative_int(why: str = "") -> Rule:
  return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0), f"an integer >= 0{why}"


def interval(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> Rule:
  def ok(v):
    v = float(v)
    return (lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)
  left, right = "(" if lo_open else "[", ")" if hi_open else "]"
  return ok, f"must be in {left}{lo}, {hi}{right}"


def one_of(config, key: str, choices: Iterable[str]) -> None:
  require(config, key, *choice(choices))


def positive_int(config, key: str) -> None:
  require(config, key, *positive_integer())


def in_range(config, key: str, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> None:
  require(config, key, *interval(lo, hi, lo_open, hi_open))
