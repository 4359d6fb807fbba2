"""Group advantages vs NumPy (sample std, ddof=1), DAPO dynamic-sampling filter and overlong penalty."""
from __future__ import annotations

import numpy as np
import pytest

from fineflax.rl.advantages import dapo_overlong_penalty, group_advantages, zero_variance_groups

pytestmark = pytest.mark.fast

G = 4
REWARDS = np.array([1, 0, 0, 1,  1, 1, 1, 1,  0.5, 0, 2, 1,  0, 0, 0, 1], np.float32)


def test_group_scale_matches_numpy_sample_std():
  got = np.asarray(group_advantages(REWARDS, G, "group"))
  for g in range(len(REWARDS) // G):
    r = REWARDS[g * G:(g + 1) * G].astype(np.float64)
    want = (r - r.mean()) / (np.std(r, ddof=1) + 1e-6)
    np.testing.assert_allclose(got[g * G:(g + 1) * G], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(got[G:2 * G], 0.0)  # all-equal group


def test_batch_and_none_scales():
  r = REWARDS.reshape(-1, G).astype(np.float64)
  centred = (r - r.mean(1, keepdims=True)).reshape(-1)
  np.testing.assert_allclose(group_advantages(REWARDS, G, "none"), centred, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(group_advantages(REWARDS, G, "batch"), centred / (np.std(REWARDS, ddof=1) + 1e-6),
                             rtol=1e-5, atol=1e-6)
  assert not np.allclose(group_advantages(REWARDS, G, "batch"), group_advantages(REWARDS, G, "group"))


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="group_size >= 2"):
    group_advantages(REWARDS, 1)
  with pytest.raises(ValueError, match="do not split into groups of 3"):
    group_advantages(REWARDS, 3)
  with pytest.raises(ValueError, match="unknown advantage scale"):
    group_advantages(REWARDS, G, "std")


def test_zero_variance_groups():
  np.testing.assert_array_equal(zero_variance_groups(REWARDS, G), [False, True, False, False])
  np.testing.assert_array_equal(zero_variance_groups(np.zeros(8), 4), [True, True])


def test_dapo_overlong_penalty_piecewise():
  max_len, buffer = 100, 20
  lengths = np.arange(0, 130)
  want = [0.0 if n <= 80 else ((80 - n) / 20 if n <= 100 else -1.0) for n in lengths]
  np.testing.assert_allclose(dapo_overlong_penalty(lengths, max_len, buffer), want, atol=1e-6)
  assert float(dapo_overlong_penalty(np.array([100]), max_len, buffer)[0]) == -1.0
  with pytest.raises(ValueError, match="buffer"):
    dapo_overlong_penalty(lengths, 10, 20)


@pytest.mark.parametrize("value,size", [(0.1, 8), (2.2, 12), (0.7, 5)])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_equal_non_dyadic_rewards_get_exactly_zero_advantage(value, size, scale):
  """f32 mean of 0.1 x 8 is not 0.1 bit for bit: without the fix |A| = 0.0074 (2.2 x 12: 0.19)."""
  rewards = np.concatenate([np.full(size, value, np.float32), np.arange(size, dtype=np.float32)])
  got = np.asarray(group_advantages(rewards, size, scale=scale))
  np.testing.assert_array_equal(got[:size], 0.0)
  assert np.abs(got[size:]).max() > 0


def _per_group_reference(rewards, ids, scale, eps=1e-6):
  """A loop over the groups in float64 (the agents' former implementation)."""
  r, ids = np.asarray(rewards, np.float64), np.asarray(ids)
  out = np.zeros_like(r)
  for g in np.unique(ids):
    x = r[ids == g]
    if len(x) < 2 or x.max() == x.min():
      continue
    c = x - x.mean()
    out[ids == g] = {"group": c / (x.std(ddof=1) + eps), "batch": c / (r.std(ddof=1) + eps), "none": c}[scale]
  return out


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_ids_match_group_size_and_a_per_group_loop(scale):
  rng = np.random.default_rng(0)
  for trial in range(50):
    size, n = int(rng.integers(2, 9)), int(rng.integers(1, 6))
    rewards = (rng.choice([0.0, 0.5, 1.0], size * n) if trial % 2 else rng.normal(size=size * n)).astype(np.float32)
    ids = np.arange(size * n) // size
    by_size = group_advantages(rewards, size, scale)
    np.testing.assert_allclose(group_advantages(rewards, [f"t{i}" for i in ids], scale), by_size, rtol=0, atol=0)
    np.testing.assert_allclose(by_size, _per_group_reference(rewards, ids, scale), rtol=1e-5, atol=1e-6)
    perm = rng.permutation(size * n)  # ids in any order: each reward keeps its advantage
    np.testing.assert_allclose(group_advantages(rewards[perm], ids[perm], scale), by_size[perm], rtol=1e-6, atol=1e-7)


def test_ragged_groups_and_groups_of_one():
  rewards = np.array([1.0, 0.0, 3.0, 2.0, 2.0, 5.0, 0.0, 1.0, 1.0], np.float32)
  ids = ["a", "a", "a", "b", "b", "c", "d", "d", "d"]  # sizes 3, 2 (equal), 1, 3
  got = group_advantages(rewards, ids)
  np.testing.assert_allclose(got, _per_group_reference(rewards, ids, "group"), rtol=1e-6)
  np.testing.assert_array_equal(got[3:6], 0.0)
  assert np.abs(got[:3]).min() > 0 and got.dtype == np.float32
  with pytest.raises(ValueError, match="3 group ids for 9 rewards"):
    group_advantages(rewards, ids[:3])
