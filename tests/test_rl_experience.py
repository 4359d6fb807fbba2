"""ExGRPO experience buffer: retirement, Gaussian bucket sampling, lowest-entropy replay, state round trip."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fineflax.rl.experience import ExperienceBuffer, experience_split, replay_active

K = 8


def _group(rng, k, length=4):
  """K completions of which the first k are correct (reward 1)."""
  comps = [rng.integers(0, 100, length) for _ in range(K)]
  logps = [-rng.uniform(0, 2, length).astype(np.float32) for _ in range(K)]
  return comps, logps, [1.0] * k + [0.0] * (K - k)


def _filled(counts, seed=0):
  """Buffer with counts[k] questions in bucket k."""
  rng = np.random.default_rng(seed)
  buf = ExperienceBuffer(K)
  for k, n in counts.items():
    for i in range(n):
      buf.add_group(f"q{k}_{i}", [1, 2, 3], *_group(rng, k))
  return buf


def test_bucket_sampling_matches_gaussian_weights():
  counts = {1: 3, 2: 1, 3: 5, 4: 2, 6: 4, 7: 1}  # bucket 5 empty
  buf = _filled(counts)
  weights = {k: math.exp(-0.5 * (k - K / 2) ** 2) for k in counts}
  total = sum(weights.values())
  probs = {k: w / total for k, w in weights.items()}
  for k in counts:
    assert buf.bucket_probs()[k] == pytest.approx(probs[k], rel=1e-12)
  n = 20000
  picks = buf.sample_questions(n, np.random.default_rng(1), replace=True)
  bucket_of = {q: k for k, qs in buf.buckets().items() for q in qs}
  observed = np.array([sum(bucket_of[q] == k for q in picks) for k in sorted(counts)])
  expected = n * np.array([probs[k] for k in sorted(counts)])
  chi2 = ((observed - expected) ** 2 / expected).sum()
  assert chi2 < 22.46  # chi-square, 5 degrees of freedom, p = 0.9996
  # a uniform choice over questions (not buckets) would fail the same test
  uniform = n * np.array([counts[k] for k in sorted(counts)]) / sum(counts.values())
  assert ((observed - uniform) ** 2 / uniform).sum() > 1000


def test_sample_without_replacement_is_distinct_and_bounded():
  buf = _filled({2: 3, 4: 3})
  picks = buf.sample_questions(6, np.random.default_rng(0))
  assert sorted(picks) == sorted(q for qs in buf.buckets().values() for q in qs)
  with pytest.raises(ValueError, match="asked for 7 distinct questions, buffer holds 6"):
    buf.sample_questions(7, np.random.default_rng(0))


def test_retirement_and_bucket_update():
  rng = np.random.default_rng(2)
  buf = ExperienceBuffer(K, max_per_question=5)
  assert buf.add_group("a", [1], *_group(rng, 3)) == 3
  assert buf.buckets() == {3: ["a"]} and len(buf.questions["a"]["trajectories"]) == 3
  buf.add_group("a", [1], *_group(rng, 6))  # latest correctness moves it; newest 5 kept
  assert buf.buckets() == {6: ["a"]} and len(buf.questions["a"]["trajectories"]) == 5
  buf.add_group("b", [1], *_group(rng, 0))  # nothing correct: nothing stored
  assert "b" not in buf
  buf.add_group("a", [1], *_group(rng, K))  # K of K: retired, dropped
  assert "a" not in buf and buf.retired == {"a"}
  buf.add_group("a", [1], *_group(rng, 2))  # retired questions are never stored again
  assert "a" not in buf
  with pytest.raises(ValueError, match="k \\(correct answers of the whole group\\) is needed"):
    buf.add_group("c", [1], [[1]], [[0.0]], [1.0])


def test_official_rules_for_groups_with_a_replayed_row():
  """ExGRPO's released code: a group holding a replayed row still re-buckets its question with the whole
  group's successes, retires it when all K are correct, and skips a k = 0 update (bucket kept)."""
  rng = np.random.default_rng(5)
  buf = ExperienceBuffer(K)
  buf.add_group("q", [1], *_group(rng, 3))
  comps, logps, rewards = _group(rng, 4)  # K - 1 fresh rows + the replayed (correct) one: k = 5
  assert buf.add_group("q", [1], comps[:K - 1], logps[:K - 1], rewards[:K - 1], k=5) == 5
  assert buf.buckets() == {5: ["q"]} and len(buf.questions["q"]["trajectories"]) == 3 + 4
  stored = [t.tokens.tolist() for t in buf.questions["q"]["trajectories"]]
  assert buf.add_group("q", [1], comps[:K - 1], logps[:K - 1], [0.0] * (K - 1), k=0) == 0
  assert buf.buckets() == {5: ["q"]}  # k = 0: the update is skipped
  assert [t.tokens.tolist() for t in buf.questions["q"]["trajectories"]] == stored
  buf.add_group("q", [1], comps[:K - 1], logps[:K - 1], [1.0] * (K - 1), k=K)
  assert "q" not in buf and buf.retired == {"q"}


def test_select_lowest_entropy_under_current_policy():
  rng = np.random.default_rng(3)
  buf = ExperienceBuffer(K)
  buf.add_group("q", [5, 6], *_group(rng, 4))
  trajs = buf.questions["q"]["trajectories"]
  current_entropy = {id(t): e for t, e in zip(trajs, [0.9, 0.2, 0.5, 0.7])}
  calls = []

  def entropy_fn(prompt, ts):
    calls.append(list(prompt))
    return [current_entropy[id(t)] for t in ts]

  assert buf.select_trajectory("q", entropy_fn) is trajs[1]
  assert calls == [[5, 6]]
  with pytest.raises(ValueError, match="returned 1 values for 4"):
    buf.select_trajectory("q", lambda p, ts: [0.0])


def test_state_dict_round_trip_json_and_orbax(tmp_path):
  import orbax.checkpoint as ocp
  buf = _filled({1: 2, 5: 1}, seed=4)
  buf.add_group("done", [9], *_group(np.random.default_rng(5), K))
  state = buf.state_dict()
  via_json = ExperienceBuffer.from_state_dict(json.loads(json.dumps(state)))
  ck = ocp.Checkpointer(ocp.JsonCheckpointHandler())
  ck.save(tmp_path / "exp", args=ocp.args.JsonSave(state))
  via_orbax = ExperienceBuffer.from_state_dict(ck.restore(tmp_path / "exp", args=ocp.args.JsonRestore()))
  for other in (via_json, via_orbax):
    assert other.state_dict() == state
    assert other.retired == {"done"} and other.buckets() == buf.buckets()
    for qid, e in buf.questions.items():
      for a, b in zip(e["trajectories"], other.questions[qid]["trajectories"]):
        np.testing.assert_array_equal(a.logp, b.logp)  # float32 exact
        assert b.logp.dtype == np.float32 and b.tokens.dtype == np.int32


def test_replay_rule_and_experience_share():
  assert not replay_active(0.35) and replay_active(0.36) and not replay_active(0.1)
  assert replay_active(0.3, threshold=0.2)
  assert experience_split(64) == (32, 32) and experience_split(10, 0.3) == (3, 7)
  with pytest.raises(ValueError):
    experience_split(8, 1.5)
