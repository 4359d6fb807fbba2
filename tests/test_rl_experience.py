"""ExGRPO experience buffer: retirement, Gaussian bucket sampling, lowest-entropy replay, state round trip."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fineflax.rl.experience import ExperienceBuffer, experience_split, replay_active

pytestmark = pytest.mark.fast

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


def test_a_question_stores_each_completion_once():
  """The official collect_experience_entries appends a correct completion only if the question does not hold
  the same text yet, so repeats cannot crowd distinct trajectories out of max_per_question."""
  buf = ExperienceBuffer(K, max_per_question=3)
  a, b, c, d = ([t] * 3 for t in (1, 2, 3, 4))
  lp = [-0.5] * 3

  def group(correct):
    comps = correct + [[9, 9, 9]] * (K - len(correct))
    return comps, [lp] * K, [1.0] * len(correct) + [0.0] * (K - len(correct))

  buf.add_group("q", [7], *group([a, a, b]))  # a repeat inside one group
  assert [t.tokens.tolist() for t in buf.questions["q"]["trajectories"]] == [a, b]
  buf.add_group("q", [7], *group([a, c, c, d]))  # a is held already; newest 3 distinct kept
  assert [t.tokens.tolist() for t in buf.questions["q"]["trajectories"]] == [b, c, d]


class _AlwaysRightEnv:
  """Every rollout answers 1 (the right answer): each group is all correct. Records the questions rolled out."""
  tok = None

  def __init__(self):
    self.rolled = []

  def rollout(self, policy, items, rng, mask_truncated=False):
    from fineflax.rl import rows as R
    self.rolled.append({p.question for p in items})
    rows = R.make_rows([[1]] * len(items), [[5, 6]] * len(items), [[1.0, 1.0]] * len(items),
                       ["<answer>1</answer>"] * len(items), off_policy=False, rollout_logp=[[-0.1, -0.1]] * len(items))
    return rows, [self.example(p) for p in items]

  def example(self, item):
    return {"answer": "1"}


def test_retired_questions_leave_the_fresh_prompts():
  """The official skip_uid_set: a question whose K rollouts were all correct is no longer a fresh prompt."""
  import types

  import jax
  import ml_collections

  from fineflax.rl.collect import collect
  from fineflax.rl.replay import Replay
  rl = ml_collections.ConfigDict(dict(prompts_per_step=2, group_size=4, max_new_tokens=8))
  replay = Replay(4, ml_collections.ConfigDict(dict(sigma=1.0, max_per_question=8, threshold=0.35, share=0.5)), 0)
  items = [types.SimpleNamespace(question=f"q{i}") for i in range(6)]
  env, order = _AlwaysRightEnv(), np.arange(6)
  g = collect(env, None, items, order, 0, jax.random.PRNGKey(0), rl, {"math_last_number": 1.0}, replay=replay)
  replay.record(g.idx, g.rows, g.rewards, g.correct, 4)
  assert g.idx == [0, 1] and replay.buffer.retired == {"0", "1"} and env.rolled == [{"q0", "q1"}]
  for cursor in (6, 8, 10):  # the order wraps round to questions 0 and 1, which are retired now
    collect(env, None, items, order, cursor, jax.random.PRNGKey(cursor), rl, {"math_last_number": 1.0},
            replay=replay)
  assert all(not {"q0", "q1"} & seen for seen in env.rolled[1:]) and set().union(*env.rolled[1:]) == {
      "q2", "q3", "q4", "q5"}
  replay.buffer.retired |= {str(i) for i in range(6)}  # everything retired: the whole order again
  fresh = replay.fresh_order(order)
  assert [fresh[k] for k in range(12)] == list(range(6)) * 2
