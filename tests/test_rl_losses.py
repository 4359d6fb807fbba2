"""RL losses vs independent NumPy transcriptions of their formulas: values and gradients wrt logp."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.rl import losses as L

pytestmark = pytest.mark.fast

B, T = 5, 7
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "sum")


def _inputs(seed=0, adv_2d=False, spread=0.5):
  rng = np.random.default_rng(seed)
  old = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
  logp = np.minimum(old + rng.normal(0, spread, (B, T)), -1e-3).astype(np.float32)
  ref = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
  adv = rng.normal(0, 1, (B, T) if adv_2d else (B,)).astype(np.float32)
  lengths = np.array([7, 3, 5, 1, 6])
  mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
  ent = rng.uniform(0, 3, (B, T)).astype(np.float32)
  return logp, old, ref, adv, mask, ent


def _adv_bt(adv):
  return adv[:, None] * np.ones((1, T)) if adv.ndim == 1 else adv


def np_clipped(logp, old, adv, el, eh, c):
  """(loss, dloss/dlogp, clip indicator) per token, float64."""
  a = _adv_bt(adv).astype(np.float64)
  r = np.exp(logp.astype(np.float64) - old)
  l1, l2 = -a * r, -a * np.clip(r, 1 - el, 1 + eh)
  inside = (r > 1 - el) & (r < 1 + eh)
  loss = np.where(l1 >= l2, l1, l2)
  grad = np.where(l1 >= l2, -a * r, np.where(inside, -a * r, 0.0))
  if c is not None:
    dual = (a < 0) & (-c * a < loss)
    loss = np.where(dual, -c * a, loss)
    grad = np.where(dual, 0.0, grad)
  return loss, grad, l2 > l1


def np_agg_weights(mask, mode, max_len=None):
  """W with aggregate(L) = sum(W * L), written row by row."""
  b, t = mask.shape
  norm = t if max_len is None else max_len
  w = np.zeros_like(mask, np.float64)
  for i in range(b):
    n = mask[i].sum()
    for j in range(t):
      if not mask[i, j]:
        continue
      w[i, j] = {"token-mean": 1 / mask.sum(), "seq-mean-token-mean": 1 / (b * n),
                 "seq-mean-token-sum": 1 / b, "seq-mean-token-sum-norm": 1 / (b * norm),
                 "sum": 1 / norm}[mode]
  return w


def _grad(fn, logp):
  return np.asarray(jax.grad(lambda lp: fn(lp))(jnp.asarray(logp)))


@pytest.mark.parametrize("el,eh,c,adv_2d", [(0.2, 0.2, None, False), (0.2, 0.28, 1.5, True)])
def test_clipped_surrogate_matches_numpy(el, eh, c, adv_2d):
  logp, old, _, adv, mask, _ = _inputs(1, adv_2d, spread=0.9)
  loss, stats = L.clipped_surrogate(logp, old, adv, mask, el, eh, c)
  ref_loss, ref_grad, clipped = np_clipped(logp, old, adv, el, eh, c)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
  g = _grad(lambda lp: jnp.sum(L.clipped_surrogate(lp, old, adv, mask, el, eh, c)[0]), logp)
  np.testing.assert_allclose(g, ref_grad, rtol=1e-5, atol=1e-6)
  frac = (clipped * mask).sum() / mask.sum()
  assert 0 < frac < 1
  np.testing.assert_allclose(stats["clip_frac"], frac, rtol=1e-6)
  r = np.exp(logp.astype(np.float64) - old)
  np.testing.assert_allclose(stats["ratio_mean"], (r * mask).sum() / mask.sum(), rtol=1e-5)
  if c is not None:
    assert stats["dual_clip_frac"] > 0


def test_unclipped_surrogate_matches_numpy():
  logp, old, _, adv, mask, _ = _inputs(2)
  r = np.exp(logp.astype(np.float64) - old)
  loss, _ = L.unclipped_surrogate(logp, old, adv, mask)
  np.testing.assert_allclose(loss, -_adv_bt(adv) * r, rtol=1e-5)
  g = _grad(lambda lp: jnp.sum(L.unclipped_surrogate(lp, old, adv, mask)[0]), logp)
  np.testing.assert_allclose(g, -_adv_bt(adv) * r, rtol=1e-5)


def test_kl_k3_zero_at_equal_nonnegative_and_gradient():
  logp, _, ref, _, _, _ = _inputs(3)
  np.testing.assert_array_equal(L.kl_k3(jnp.asarray(logp), jnp.asarray(logp)), 0.0)
  kl = np.asarray(L.kl_k3(logp, ref))
  d = ref.astype(np.float64) - logp
  np.testing.assert_allclose(kl, np.exp(d) - d - 1, rtol=1e-5, atol=1e-7)
  assert (kl >= 0).all() and (kl > 0).any()
  g = _grad(lambda lp: jnp.sum(L.kl_k3(lp, ref)), logp)
  np.testing.assert_allclose(g, 1 - np.exp(d), rtol=1e-5, atol=1e-6)


def test_policy_shaping_value_and_gradient():
  logp, _, beh, adv, _, _ = _inputs(4)
  gamma = 0.1
  a, p = _adv_bt(adv), np.exp(logp.astype(np.float64))
  np.testing.assert_allclose(L.policy_shaping_loss(logp, adv, gamma), -a * p / (p + gamma), rtol=1e-5)
  g = _grad(lambda lp: jnp.sum(L.policy_shaping_loss(lp, adv, gamma)), logp)
  np.testing.assert_allclose(g, -a * gamma * p / (p + gamma) ** 2, rtol=1e-5, atol=1e-7)
  x = np.exp(logp.astype(np.float64) - beh)  # behaviour probs given: LUFFY code uses the plain ratio
  np.testing.assert_allclose(L.policy_shaping_loss(logp, adv, gamma, beh, shape=False), -a * x, rtol=1e-5)
  g = _grad(lambda lp: jnp.sum(L.policy_shaping_loss(lp, adv, gamma, beh, shape=True)), logp)
  np.testing.assert_allclose(g, -a * gamma * x / (x + gamma) ** 2, rtol=1e-5, atol=1e-7)


def test_aggregate_modes_match_formulas():
  rng = np.random.default_rng(5)
  loss = rng.normal(size=(B, T)).astype(np.float32)
  _, _, _, _, mask, _ = _inputs(5)
  mask[3] = 0  # a fully masked row
  out = {}
  for mode in MODES:
    out[mode] = float(L.aggregate(loss, mask, mode))
    np.testing.assert_allclose(out[mode], (np_agg_weights(mask, mode) * loss).sum(), rtol=1e-5)
  np.testing.assert_allclose(out["sum"], B * out["seq-mean-token-sum-norm"], rtol=1e-5)
  np.testing.assert_allclose(out["seq-mean-token-sum"], T * out["seq-mean-token-sum-norm"], rtol=1e-5)
  assert abs(out["token-mean"] - out["seq-mean-token-mean"]) > 1e-3  # unequal row lengths
  np.testing.assert_allclose(L.aggregate(loss, mask, "sum", max_len=100), loss[mask > 0].sum() / 100, rtol=1e-5)
  full = np.ones((B, T), np.float32)  # equal lengths: token-mean == seq-mean-token-mean
  np.testing.assert_allclose(L.aggregate(loss, full, "token-mean"), L.aggregate(loss, full, "seq-mean-token-mean"),
                             rtol=1e-6)
  assert float(L.aggregate(loss, np.zeros((B, T)), "token-mean")) == 0.0
  with pytest.raises(ValueError, match="unknown aggregation mode"):
    L.aggregate(loss, mask, "mean")


def test_ratio_one_zero_advantage_gives_zero_policy_gradient():
  logp, _, ref, adv, mask, _ = _inputs(6)
  zero = np.zeros_like(adv)
  for a in (zero, adv):
    g = _grad(lambda lp: L.grpo_loss(lp, jax.lax.stop_gradient(lp), ref, a, mask)[0], logp)
    assert np.all(g == 0) == (a is zero)


@pytest.mark.parametrize("mode", MODES)
def test_grpo_loss_matches_numpy(mode):
  logp, old, ref, adv, mask, ent = _inputs(7)
  beta, ent_coef, el, eh = 0.04, 0.01, 0.2, 0.28
  fn = lambda lp: L.grpo_loss(lp, old, ref, adv, mask, epsilon_low=el, epsilon_high=eh, beta=beta,
                              entropy_coef=ent_coef, entropy=ent, agg_mode=mode)
  loss, metrics = fn(jnp.asarray(logp))
  pg, pg_grad, _ = np_clipped(logp, old, adv, el, eh, None)
  d = ref.astype(np.float64) - logp
  w = np_agg_weights(mask, mode)
  per_token = pg + beta * (np.exp(d) - d - 1)
  ent_token_mean = (ent * mask).sum() / max(mask.sum(), 1)  # LUFFY: the entropy bonus is a token mean
  np.testing.assert_allclose(loss, (w * per_token).sum() - ent_coef * ent_token_mean, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["pg_loss"], (w * pg).sum(), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(_grad(lambda lp: fn(lp)[0], logp), w * (pg_grad + beta * (1 - np.exp(d))),
                             rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("clip,mode", [(True, "seq-mean-token-mean"), (False, "sum"), (True, "token-mean")])
def test_luffy_without_off_policy_rows_equals_grpo(clip, mode):
  logp, old, ref, adv, mask, ent = _inputs(8)
  kw = dict(beta=0.04, entropy_coef=0.001, entropy=ent, agg_mode=mode)
  grpo = lambda lp: L.grpo_loss(lp, old, ref, adv, mask, clip=clip, **kw)[0]
  luffy = lambda lp: L.luffy_loss(lp, old, adv, mask, np.zeros(B, bool), on_policy_clip=clip,
                                  ref_logp=ref, **kw)[0]
  np.testing.assert_array_equal(grpo(jnp.asarray(logp)), luffy(jnp.asarray(logp)))
  np.testing.assert_array_equal(_grad(grpo, logp), _grad(luffy, logp))


def test_luffy_mixed_batch_matches_numpy():
  logp, old, _, adv, mask, _ = _inputs(9)
  off = np.array([True, False, False, True, False])
  gamma = 0.1
  fn = lambda lp: L.luffy_loss(lp, old, adv, mask, off, gamma=gamma, on_policy_clip=False, agg_mode="sum")[0]
  a, p = _adv_bt(adv), np.exp(logp.astype(np.float64))
  r = np.exp(logp.astype(np.float64) - old)
  per_token = np.where(off[:, None], -a * p / (p + gamma), -a * r)
  dper = np.where(off[:, None], -a * gamma * p / (p + gamma) ** 2, -a * r)
  w = np_agg_weights(mask, "sum")
  np.testing.assert_allclose(fn(jnp.asarray(logp)), (w * per_token).sum(), rtol=1e-5)
  np.testing.assert_allclose(_grad(fn, logp), w * dper, rtol=1e-5, atol=1e-7)


def test_exgrpo_replay_weight_and_loss():
  logp, old, rec, adv, mask, _ = _inputs(10)
  w = np.exp(logp.astype(np.float64) - rec)
  np.testing.assert_allclose(L.exgrpo_replay_weight(logp, rec), w / (w + 0.1), rtol=1e-5)
  replay = np.array([False, True, False, False, True])
  fn = lambda lp: L.exgrpo_loss(lp, old, rec, adv, mask, replay, agg_mode="token-mean")[0]
  pg, pg_grad, _ = np_clipped(logp, old, adv, 0.2, 0.2, None)
  a = _adv_bt(adv)
  per_token = np.where(replay[:, None], -a * w / (w + 0.1), pg)
  dper = np.where(replay[:, None], -a * 0.1 * w / (w + 0.1) ** 2, pg_grad)
  wt = np_agg_weights(mask, "token-mean")
  np.testing.assert_allclose(fn(jnp.asarray(logp)), (wt * per_token).sum(), rtol=1e-5)
  np.testing.assert_allclose(_grad(fn, logp), wt * dper, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", L.AGG_MODES)
def test_rows_padded_by_pad_rows_change_no_aggregate(mode):
  """`fineflax.rl.batch.pad_rows` (agent RL's row buckets, the mesh split): same loss as the real rows."""
  from fineflax.rl.batch import pad_rows
  rng = np.random.default_rng(0)
  b, t = 5, 7
  batch = {"tokens": rng.integers(1, 50, (b, t)), "mask": (rng.random((b, t)) < 0.7).astype(np.float32),
           "advantages": rng.normal(size=b).astype(np.float32), "is_off_policy": np.ones(b, bool),
           "loss": rng.normal(size=(b, t)).astype(np.float32)}
  padded = pad_rows(batch, 4)
  assert padded["tokens"].shape == (8, t) and padded["num_rows"] == b
  np.testing.assert_array_equal(padded["tokens"][b:], np.repeat(batch["tokens"][:1], 3, 0))
  assert not padded["mask"][b:].any() and not padded["advantages"][b:].any() and not padded["is_off_policy"][b:].any()
  want = L.aggregate(jnp.asarray(batch["loss"]), batch["mask"], mode)
  got = L.aggregate(jnp.asarray(padded["loss"]), padded["mask"], mode, num_rows=padded["num_rows"])
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert pad_rows(batch, 5) is batch
