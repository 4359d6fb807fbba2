"""Rollout importance correction (TIS, MIS) and the mismatch metrics vs a NumPy transcription of the papers'
formulas (Yao et al. 2025 TIS: min(r, C); slime / Liu et al. 2025 MIS: r masked outside [1/C, C]), and their
place in the GRPO / LUFFY losses."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.config_checks import ConfigError
from fineflax.rl import importance as I
from fineflax.rl import losses as L
from fineflax.rl.config import RLConfig

pytestmark = pytest.mark.fast

B, T = 6, 9


def _inputs(seed=0, spread=0.8):
  rng = np.random.default_rng(seed)
  old = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
  beh = (old + rng.normal(0, spread, (B, T))).astype(np.float32)
  logp = (old + rng.normal(0, 0.1, (B, T))).astype(np.float32)
  adv = rng.normal(0, 1, B).astype(np.float32)
  mask = (np.arange(T)[None] < np.array([9, 4, 6, 1, 7, 0])[:, None]).astype(np.float32)
  return logp, old, beh, adv, mask


def np_weights(old, beh, mask, mode, level, cap):
  """w per token, written token by token / row by row (float64)."""
  w = np.zeros(old.shape)
  for b in range(old.shape[0]):
    if level == "sequence":
      s = sum(float(old[b, t]) - float(beh[b, t]) for t in range(old.shape[1]) if mask[b, t])
      ratios = [np.exp(min(max(s, -20), 20))] * old.shape[1]
    else:
      ratios = [np.exp(float(old[b, t]) - float(beh[b, t])) for t in range(old.shape[1])]
    for t, r in enumerate(ratios):
      if mode == "tis":
        w[b, t] = min(r, cap)
      elif mode == "mis":
        w[b, t] = r if 1 / cap <= r <= cap else 0.0
      else:
        w[b, t] = 1.0
  return w


@pytest.mark.parametrize("mode,level,cap", [("tis", "token", 2.0), ("mis", "token", 2.0), ("tis", "sequence", 2.0),
                                            ("mis", "sequence", 3.0), ("none", "token", 2.0)])
def test_weights_and_statistics_match_numpy(mode, level, cap):
  _, old, beh, _, mask = _inputs(1, spread=1.0 if level == "token" else 0.15)
  w, stats = I.importance_weights(old, beh, mask, mode, level, cap)
  want = np_weights(old, beh, mask, mode, level, cap)
  np.testing.assert_allclose(np.asarray(w) * mask, want * mask, rtol=1e-5)
  r = np_weights(old, beh, mask, "tis", level, np.inf)  # the raw ratio
  on = mask > 0
  shown = r if mode == "none" else want
  np.testing.assert_allclose(stats["is_weight_mean"], shown[on].mean(), rtol=1e-5)
  np.testing.assert_allclose(stats["is_weight_max"], shown[on].max(), rtol=1e-5)
  np.testing.assert_allclose(stats["is_truncated_frac"], (r[on] > cap).mean(), rtol=1e-6)
  np.testing.assert_allclose(stats["is_masked_frac"], ((r[on] < 1 / cap) | (r[on] > cap)).mean(), rtol=1e-6)
  if level == "token" and mode != "none":  # the data reach both sides of [1/C, C]: the test tells truncation from masking
    assert 0 < stats["is_truncated_frac"] < stats["is_masked_frac"] < 1


def test_mismatch_metrics_match_numpy_and_vanish_when_log_probs_agree():
  _, old, beh, _, mask = _inputs(2)
  on = mask > 0
  d = old.astype(np.float64) - beh
  m = I.mismatch_stats(old, beh, mask)
  np.testing.assert_allclose(m["mismatch_kl"], (np.exp(d) - 1 - d)[on].mean(), rtol=1e-5)
  np.testing.assert_allclose(m["mismatch_kl_k1"], (-d)[on].mean(), rtol=1e-5)
  np.testing.assert_allclose(m["mismatch_max_abs_dlogp"], np.abs(d)[on].max(), rtol=1e-6)
  same = I.mismatch_stats(old, old, mask)
  assert all(float(v) == 0.0 for v in same.values())


@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_grpo_loss_weights_the_policy_gradient_and_not_the_kl(mode):
  logp, old, beh, adv, mask = _inputs(3)
  ref = old - 0.3
  kw = dict(beta=0.04, agg_mode="token-mean", behaviour_logp=beh, importance_level="token")
  plain = lambda lp: L.grpo_loss(lp, old, ref, adv, mask, **kw)
  fixed = lambda lp: L.grpo_loss(lp, old, ref, adv, mask, importance=mode, **kw)
  w = np_weights(old, beh, mask, mode, "token", 2.0)
  a = adv[:, None].astype(np.float64)
  r = np.exp(logp.astype(np.float64) - old)
  pg = np.maximum(-a * r, -a * np.clip(r, 0.8, 1.2))
  dk = ref.astype(np.float64) - logp
  n = mask.sum()
  np.testing.assert_allclose(fixed(jnp.asarray(logp))[0], ((pg * w + 0.04 * (np.exp(dk) - dk - 1)) * mask).sum() / n,
                             rtol=1e-5)
  np.testing.assert_allclose(plain(jnp.asarray(logp))[1]["pg_loss"], (pg * mask).sum() / n, rtol=1e-5)
  g_plain = np.asarray(jax.grad(lambda lp: plain(lp)[1]["pg_loss"])(jnp.asarray(logp)))
  g_fixed = np.asarray(jax.grad(lambda lp: fixed(lp)[1]["pg_loss"])(jnp.asarray(logp)))
  np.testing.assert_allclose(g_fixed, g_plain * w, rtol=1e-5, atol=1e-8)  # w is a constant of the gradient


def test_luffy_corrects_only_on_policy_rows():
  logp, old, beh, adv, mask = _inputs(4)
  off = np.array([False, True, False, False, True, False])
  kw = dict(gamma=0.1, on_policy_clip=False, agg_mode="sum", behaviour_logp=beh)
  loss_tis, m = L.luffy_loss(jnp.asarray(logp), old, adv, mask, off, importance="tis", **kw)
  a = adv[:, None].astype(np.float64)
  p, r = np.exp(logp.astype(np.float64)), np.exp(logp.astype(np.float64) - old)
  w = np_weights(old, beh, mask, "tis", "token", 2.0)
  per_token = np.where(off[:, None], -a * p / (p + 0.1), -a * r * w)
  np.testing.assert_allclose(loss_tis, (per_token * mask).sum() / T, rtol=1e-5)
  on = (mask > 0) & ~off[:, None]
  d = old.astype(np.float64) - beh
  np.testing.assert_allclose(m["mismatch_max_abs_dlogp"], np.abs(d)[on].max(), rtol=1e-6)


def test_importance_without_behaviour_logp_and_bad_settings_are_named():
  logp, old, _, adv, mask = _inputs(5)
  with pytest.raises(ValueError, match="importance='tis' needs the batch's behaviour_logp"):
    L.grpo_loss(logp, old, None, adv, mask, importance="tis")
  with pytest.raises(ConfigError, match="rl.importance"):
    RLConfig(importance="clip")
  with pytest.raises(ConfigError, match="rl.importance_cap"):
    RLConfig(importance_cap=1.0)
  with pytest.raises(ConfigError, match="rl.async_steps"):
    RLConfig(async_steps=-1)
  with pytest.raises(ConfigError, match="importance_level='sequence'"):
    RLConfig(importance_level="sequence", micro_batch_tokens=256)


@pytest.mark.parametrize("async_steps, given, resolved", [(0, "auto", "none"), (1, "auto", "tis"), (2, "auto", "tis"),
                                                          (1, "none", "none"), (0, "mis", "mis")])
def test_auto_importance_is_tis_only_for_stale_rollouts(async_steps, given, resolved):
  """rl.importance="auto" (the default of configs/common.py) corrects async runs and leaves the synchronous loop
  as it was; the checked RLConfig and the loss settings built from the raw config agree."""
  import ml_collections
  from configs.common import rl as rl_section
  from fineflax.rl.objectives import get_objective
  assert RLConfig(importance=given, async_steps=async_steps).importance == resolved
  rl = rl_section(ml_collections.ConfigDict(), prompts_per_step=2, group_size=2, max_new_tokens=8, temperature=1.0).rl
  assert rl.importance == "auto"
  rl.importance, rl.async_steps = given, async_steps
  assert get_objective("grpo").kwargs(rl)["importance"] == resolved
