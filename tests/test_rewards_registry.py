"""Registry lookups and score_completions (weighting, error isolation, threads)."""
import logging

import numpy as np
import pytest

from fineflax.rewards import REWARDS, get_reward, register, score_completions

pytestmark = pytest.mark.fast


@register("_test_raises_on_b")
def _raises_on_b(prompt, completion, **example):
  if completion == "b":
    raise RuntimeError("boom")
  return float(len(completion))


@register("_test_nan")
def _nan(prompt, completion, **example):
  return float("nan")


@pytest.fixture(autouse=True, scope="module")
def _unregister_test_rewards():
  yield
  for name in ("_test_raises_on_b", "_test_nan"):
    REWARDS.pop(name, None)


def test_unknown_name_lists_available():
  with pytest.raises(KeyError, match="available") as info:
    get_reward("nope")
  assert "math" in str(info.value) and "exact_match" in str(info.value)


def test_duplicate_registration_is_an_error():
  with pytest.raises(ValueError, match="already registered"):
    register("math")(lambda p, c, **e: 0.0)
  assert REWARDS["math"].__name__ != "<lambda>"


@pytest.mark.parametrize("workers", [1, 4])
def test_weighted_sum_and_errors(workers, caplog):
  prompts, completions = ["p"] * 3, ["aa", "b", "<think>x</think><answer>aa</answer>"]
  examples = [{"answer": "aa"}, {"answer": "b"}, {"answer": "aa"}]
  weights = {"_test_raises_on_b": 0.5, "exact_match": 2.0, "_test_nan": 1.0}
  with caplog.at_level(logging.ERROR):
    total, per_fn, errors = score_completions(weights, prompts, completions, examples, max_workers=workers)
  assert errors == {"_test_raises_on_b": 1, "exact_match": 0, "_test_nan": 3}
  np.testing.assert_allclose(per_fn["_test_raises_on_b"], [2.0, 0.0, len(completions[2])])
  np.testing.assert_allclose(per_fn["exact_match"], [0.0, 0.0, 1.0])  # no <answer>: 0
  expected = sum(w * per_fn[name] for name, w in weights.items())
  np.testing.assert_allclose(total, expected)
  assert total.shape == (3,) and np.isfinite(total).all()
  assert "boom" in caplog.text


def test_length_mismatch_is_an_error():
  with pytest.raises(ValueError, match="2 prompts"):
    score_completions({"format": 1.0}, ["a", "b"], ["x"], [{}])


@register("_test_setup_error")
def _setup_error(prompt, completion, **example):
  from fineflax.rewards import RewardSetupError
  raise RewardSetupError("sandbox cannot start here")


@pytest.mark.parametrize("workers", [1, 2])
def test_setup_error_stops_scoring_instead_of_scoring_zero(workers):
  from fineflax.rewards import RewardSetupError
  with pytest.raises(RewardSetupError, match="sandbox cannot start"):
    score_completions({"_test_setup_error": 1.0}, ["p", "q"], ["a", "b"], max_workers=workers)
