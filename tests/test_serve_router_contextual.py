"""The contextual router (per-category bandits + overall, priors) against a NumPy simulation of the same
bandits with the same seed: the same choices and the same statistics, for UCB1 and Thompson."""
import numpy as np
import pytest

from fineflax.serve.feedback import FeedbackLog
from fineflax.serve.router import ContextualRouter, simulate_contextual

pytestmark = pytest.mark.fast

VARIANTS = ["bm25_rag", "dense_rag", "agentic_rag"]
RATES = {"keyword": {"bm25_rag": 0.9, "dense_rag": 0.5, "agentic_rag": 0.6},
         "paraphrase": {"bm25_rag": 0.3, "dense_rag": 0.8, "agentic_rag": 0.5},
         "multi_hop": {"bm25_rag": 0.2, "dense_rag": 0.25, "agentic_rag": 0.7}}
PRIORS = {"agentic_rag": {"n": 4, "mean": 0.5, "by_category": {"multi_hop": {"n": 6, "mean": 0.75}}},
          "bm25_rag": {"by_category": {"keyword": {"n": 3, "mean": 1.0}}}}


def numpy_bandits(kind, categories, seed, contextual):
  """Independent reference: arrays n, s, ss per key ("all" and each category), priors as pseudo-rewards."""
  rng, rewards = np.random.default_rng(seed), np.random.default_rng(seed + 1)
  def fresh(prior_of):
    n, s, ss = np.zeros(3), np.zeros(3), np.zeros(3)
    for i, v in enumerate(VARIANTS):
      p = prior_of(PRIORS.get(v, {}))
      if p:
        n[i], s[i], ss[i] = p["n"], p["n"] * p["mean"], p["n"] * p["mean"] ** 2
    return [n, s, ss]
  stats = {"all": fresh(lambda p: p if "n" in p else None)}
  chosen = []
  for c in categories:
    if c not in stats:
      stats[c] = fresh(lambda p: p.get("by_category", {}).get(c))
    n, s, _ = stats[c if contextual else "all"]
    if (n == 0).any():
      i = int(np.flatnonzero(n == 0)[0])
    elif kind == "ucb1":
      i = int(np.argmax(s / n + np.sqrt(2 * np.log(n.sum()) / n)))
    else:
      i = int(np.argmax([rng.beta(1 + s[j], 1 + n[j] - s[j]) for j in range(3)]))
    r = float(rewards.random() < RATES[c][VARIANTS[i]])
    for key in ("all", c):
      stats[key][0][i] += 1
      stats[key][1][i] += r
      stats[key][2][i] += r * r
    chosen.append(VARIANTS[i])
  return chosen, stats


@pytest.mark.parametrize("kind", ["ucb1", "thompson"])
@pytest.mark.parametrize("contextual", [True, False])
def test_per_category_statistics_match_a_numpy_simulation(kind, contextual):
  categories = list(np.random.default_rng(7).choice(list(RATES), 600))
  router = ContextualRouter(VARIANTS, kind, seed=3, contextual=contextual, priors=PRIORS)
  chosen, regret = simulate_contextual(router, RATES, categories, seed=4)
  want, stats = numpy_bandits(kind, categories, 3, contextual)
  assert chosen == want
  bandits = {"all": router.overall, **router.categories}
  assert set(bandits) == set(stats)
  for key, (n, s, ss) in stats.items():
    r = bandits[key]
    assert [r.n[v] for v in VARIANTS] == n.tolist(), key
    assert [r.total[v] for v in VARIANTS] == pytest.approx(s.tolist()) and [r.total_sq[v] for v in VARIANTS] == pytest.approx(ss.tolist())
  best = [max(RATES[c].values()) - RATES[c][v] for c, v in zip(categories, chosen)]
  assert regret == pytest.approx(np.cumsum(best))


def test_contextual_routing_finds_each_categorys_best_arm():
  categories = list(np.random.default_rng(0).choice(list(RATES), 3000))
  out = {}
  for contextual in (True, False):
    chosen, regret = simulate_contextual(ContextualRouter(VARIANTS, "thompson", seed=0, contextual=contextual),
                                         RATES, categories, seed=1)
    out[contextual] = regret[-1]
    if contextual:
      for c in RATES:
        last = [v for cc, v in zip(categories, chosen) if cc == c][-200:]
        assert np.mean([v == max(RATES[c], key=RATES[c].get) for v in last]) >= 0.9, c
  assert out[True] < 0.5 * out[False]


def test_router_restarts_from_the_logs_per_category_sums(tmp_path):
  log = FeedbackLog(tmp_path / "log.sqlite")
  router = ContextualRouter(VARIANTS, "ucb1", seed=0, priors=PRIORS)
  rng = np.random.default_rng(0)
  for i, c in enumerate(rng.choice(list(RATES), 200)):
    v = router.choose(c)
    log.add_responses([{"id": f"r{i}", "variant": v, "request": {}, "messages": [], "answer": "a",
                        "settings": {}, "category": str(c)}])
    reward = float(rng.random() < RATES[c][v])
    _, variant, category = log.add_feedback_in_context(f"r{i}", reward)
    router.update(variant, reward, category)
  reopened = ContextualRouter(VARIANTS, "ucb1", seed=0, priors=PRIORS).load(log.reward_sums(by_category=True))
  assert reopened.snapshot() == router.snapshot()
  board = log.leaderboard()
  for c in RATES:
    means = [row["mean_reward"] for row in board[c]]
    assert means == sorted(means, reverse=True) and sum(row["feedback"] for row in board[c]) == \
        sum(router.categories[c].n.values()) - sum(p.get("by_category", {}).get(c, {}).get("n", 0) for p in PRIORS.values())
