"""fineflax.sampling.replicas: how a mesh's rows are split over per-device engines (the parity of the split
run with one device, sampled and greedy, is in tests/test_rl_mesh.py, on 4 forced CPU devices)."""
import numpy as np
import pytest

from fineflax.sampling.replicas import assign_rows, replicas_of

pytestmark = pytest.mark.fast


def test_groups_stay_whole_and_every_row_is_placed_once():
  rng = np.random.default_rng(0)
  prompts = []
  for g in range(13):  # GRPO-like: groups of identical prompts, interleaved with singles
    p = list(rng.integers(2, 100, rng.integers(1, 20)))
    prompts += [p] * int(rng.integers(1, 9))
  for n in (1, 2, 3, 4, 8):
    parts = assign_rows(prompts, n, budget=16)
    assert len(parts) == n and sorted(r for p in parts for r in p) == list(range(len(prompts)))
    owner = {r: i for i, p in enumerate(parts) for r in p}
    for r, p in enumerate(prompts):  # identical prompts share a device (their pages are shared)
      assert all(owner[q] == owner[r] for q in range(len(prompts)) if prompts[q] == p)
    assert all(p == sorted(p) for p in parts)


def test_work_is_balanced_within_the_largest_group():
  prompts = [[1] * 10] * 8 + [[2] * 3] * 4 + [[3] * 7] * 4 + [[4]] * 2
  budget = 5
  parts = assign_rows(prompts, 2, budget)
  work = [sum(len(prompts[r]) + budget for r in p) for p in parts]
  largest = 8 * (10 + budget)
  assert abs(work[0] - work[1]) <= largest, work
  # greedy largest-first: the 8-row group alone on one device, everything else on the other
  assert sorted(map(len, parts)) == [8, 10]


def test_no_split_without_a_mesh_of_several_devices():
  assert replicas_of("replicas", None) is None
  import jax
  from fineflax.mesh import make_mesh
  assert replicas_of("replicas", make_mesh(devices=jax.devices()[:1])) is None


def test_a_session_used_before_start_and_a_bad_append_are_clear_errors():
  from fineflax.sampling.replicas import ReplicaSession
  s = ReplicaSession(["d0", "d1"], make=None, place=None, max_total_len=4, vocab_size=10)
  for call in (lambda: s.decode(2), lambda: s.rows(), lambda: s.append({0: [1]})):
    with pytest.raises(RuntimeError, match="start"):
      call()
  s.sessions, s.num_rows, s.where = ["a", "b"], 2, {0: (0, 0), 1: (1, 0)}  # as after start()
  with pytest.raises(ValueError, match="row 5 out of range"):
    s.append({5: [1]})
  with pytest.raises(ValueError):
    s.append({1: [99]})  # outside the vocabulary
