"""No-model baselines of the RL environments (constant answer; Search-R1's prior from the training facts),
scored by the environments' own evaluation code, against a direct count over the held-out items."""
from __future__ import annotations

import collections

import pytest

from fineflax.envs import get_env_class
from fineflax.jobs.resolve import load_config

pytestmark = pytest.mark.fast


def _env(spec, over=()):
  config = load_config(spec, list(over))
  return get_env_class(config.env)(config, tokenizer=None)


def test_arithmetic_constant_answer_scores_its_share_of_every_set():
  env = _env("configs/luffy_arith.py:smoke", ["task.num_eval=64", "task.num_train=400"])
  base = env.no_model_baselines()["constant"]
  counts = collections.Counter(p.answer for p in env.train_items)
  assert counts[base["answer"]] == max(counts.values())
  sets = {"eval_": env.eval_items, **{f"eval_{n}_": v for n, v in env.extra_eval_sets.items()}}
  assert len(sets) == 3
  for prefix, items in sets.items():
    share = sum(p.answer == base["answer"] for p in items) / len(items)
    assert base[f"{prefix}accuracy"] == pytest.approx(share) and base[f"{prefix}pass_at_2"] == base[f"{prefix}accuracy"]
  assert 0 < base["eval_accuracy"] < 1  # the set holds the constant answer, but not only it


def test_search_r1_constant_and_prior_by_hops():
  env = _env("configs/search_r1.py", ["num_eval=128"])
  b = env.no_model_baselines()
  train, items = env.train_items, env.eval_items
  mode = lambda answers: sorted(collections.Counter(answers).items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
  prior = {k: mode([q.answer for q in train if q.kind == k]) for k in {q.kind for q in train}}
  assert b["constant"]["answer"] == mode([q.answer for q in train])
  for hops in (1, 2):
    qs = [q for q in items if q.hops == hops]
    assert b["prior"][f"eval_em_{hops}hop"] == pytest.approx(sum(prior[q.kind] == q.answer for q in qs) / len(qs))
    assert b["constant"][f"eval_em_{hops}hop"] == pytest.approx(
        sum(b["constant"]["answer"] == q.answer for q in qs) / len(qs))
  assert b["prior"]["eval_em_2hop"] > 0  # country questions: a training country is sometimes right
