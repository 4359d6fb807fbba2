"""Bandit router: convergence on simulated Bernoulli rewards, persistence through the reward log."""
import numpy as np
import pytest
from scipy import stats as scipy_stats

from fineflax.serve.feedback import FeedbackLog, ci95
from fineflax.serve.router import Router, simulate

RATES = {"weak": 0.3, "strong": 0.6}


@pytest.mark.parametrize("kind", ["ucb1", "thompson"])
def test_router_sends_most_of_the_last_500_of_2000_to_the_better_variant(kind):
  chosen, regret = simulate(Router(list(RATES), kind=kind, seed=0), RATES, 2000, seed=1)
  share = np.mean([c == "strong" for c in chosen[-500:]])
  assert share >= 0.9, share
  assert regret[-1] < 0.3 * 2000 / 4  # far below uniform routing's expected regret (0.15 per request)
  assert np.all(np.diff(regret) > -1e-9)


def test_ucb1_score_formula():
  r = Router(["a", "b"], kind="ucb1").load({"a": {"n": 10, "sum": 6.0, "sum_sq": 6.0, "binary": True},
                                           "b": {"n": 2, "sum": 1.0, "sum_sq": 1.0, "binary": True}})
  # a: 0.6 + sqrt(2 ln 12 / 10) = 1.305; b: 0.5 + sqrt(2 ln 12 / 2) = 2.076
  assert r.choose() == "b"
  r.load({"b": {"n": 200, "sum": 20.0, "sum_sq": 20.0, "binary": True}})  # b: 202 pulls, mean 0.104
  assert r.choose() == "a"


def test_thompson_uses_a_gaussian_posterior_for_real_rewards():
  r = Router(["a", "b"], kind="thompson", seed=0)
  for _ in range(50):
    r.update("a", 2.5)
    r.update("b", -1.0)
  assert not r.binary["a"] and r.choose() == "a"


def test_router_state_survives_a_restart_through_the_log(tmp_path):
  path = tmp_path / "log.sqlite"
  log = FeedbackLog(path)
  rng = np.random.default_rng(0)
  router = Router(list(RATES), seed=0)
  rows, rewards = [], {v: [] for v in RATES}
  for i in range(300):
    v = router.choose()
    rows.append({"id": f"r{i}", "variant": v, "request": {}, "messages": [], "answer": "", "settings": {}})
    log.add_responses(rows[-1:])
    reward = float(rng.random() < RATES[v])
    log.add_feedback(f"r{i}", reward)
    router.update(v, reward)
    rewards[v].append(reward)
  log.close()
  reopened = Router(list(RATES), seed=0).load(FeedbackLog(path).reward_sums())
  assert reopened.snapshot() == router.snapshot()
  stats = FeedbackLog(path).stats()
  for v, xs in rewards.items():
    m, s = np.mean(xs), np.std(xs, ddof=1)
    assert stats[v]["feedback"] == len(xs) and stats[v]["mean_reward"] == pytest.approx(m)
    assert stats[v]["ci95"] == pytest.approx(list(scipy_stats.t.interval(0.95, len(xs) - 1, loc=m,
                                                                         scale=s / np.sqrt(len(xs)))))


def test_ci95_degenerate_counts():
  assert ci95(0, 0.0, 0.0) == (None, None, None)
  assert ci95(1, 0.7, 0.49) == (0.7, None, None)
