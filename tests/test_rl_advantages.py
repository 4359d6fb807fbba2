"""Group advantages vs NumPy (sample std, ddof=1), DAPO dynamic-sampling filter and overlong penalty."""
from __future__ import annotations

import numpy as np
import pytest

from fineflax.rl.advantages import dapo_overlong_penalty, group_advantages, zero_variance_groups

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
