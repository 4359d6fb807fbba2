"""On-policy old log-probs (config.rl.old_logp="auto", fineflax.rl.update.reuses_current_logp): when a
rollout batch gets exactly one optimizer step, the step reads old_logp = stop_gradient(logp) instead of a
recomputed forward; its loss and gradient equal the recomputed path's (f32, tiny model, full parameters)
for GRPO, LUFFY's mixed rows and ExGRPO's replayed rows, through rl_update and through UpdatePlan's
row micro-batches (rl.micro_batch_size). With two mini-batches (or iterations) the skip is not taken."""
import functools

import jax
import numpy as np
import optax
import pytest

from fineflax.config_checks import ConfigError
from fineflax.models import init_params
from fineflax.rl.config import LuffyConfig, PPOConfig, RLConfig
from fineflax.rl.minibatch import UpdatePlan
from fineflax.rl.step import completion_logp, make_rl_fns, rl_loss
from fineflax.rl.update import reuses_current_logp, rl_update
from fineflax.train.state import init_state
from test_train_rl_step import CFG, FWD, _batch

KW = dict(epsilon_low=0.2, epsilon_high=0.28, beta=0.0, entropy_coef=0.01, agg_mode="token-mean", max_len=16)
LOSS_KW = {"grpo": dict(KW, clip=True), "luffy": dict(KW, gamma=0.1), "exgrpo": dict(KW, replay_beta=0.1)}


@pytest.fixture(scope="module")
def params():
  return init_params(CFG, jax.random.PRNGKey(0))


def _host_batch(objective: str) -> dict:
  batch = {k: np.asarray(v) for k, v in _batch(b=8).items()}  # rows 0 and 4 off-policy / replayed
  if objective == "exgrpo":
    batch["behaviour_logp"] = -np.random.RandomState(1).rand(*batch["mask"].shape).astype(np.float32)
  return batch


def _close(a, b, tol=1e-6):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


@pytest.mark.parametrize("objective", ["grpo", "luffy", "exgrpo"])
def test_on_policy_loss_and_gradient_equal_the_recomputed_path(params, objective):
  batch = _host_batch(objective)
  loss = lambda on, p, b: rl_loss(p, None, b, objective=objective, loss_kwargs=LOSS_KW[objective], fwd_kwargs=FWD,
                                  on_policy=on)
  old = np.asarray(completion_logp(params, None, batch, **FWD)[0])
  (want, m_want), g_want = jax.value_and_grad(functools.partial(loss, False), has_aux=True)(
      params, dict(batch, old_logp=old))
  (got, m_got), g_got = jax.value_and_grad(functools.partial(loss, True), has_aux=True)(params, batch)
  assert abs(float(got) - float(want)) <= 1e-6 and abs(float(m_got["ratio_mean"]) - 1.0) <= 1e-6
  assert max(float(np.abs(x).max()) for x in jax.tree.leaves(g_want)) > 1e-3  # a gradient that could differ
  _close(g_got, g_want)
  with pytest.raises(ValueError, match="on_policy=True"):
    loss(True, params, dict(batch, old_logp=old))


@pytest.mark.fast
def test_reuses_current_logp_only_for_one_step_without_a_critic():
  rl = lambda **kw: RLConfig(prompts_per_step=4, group_size=2, **kw)
  assert reuses_current_logp(rl(), 1)
  assert not reuses_current_logp(rl(old_logp="recompute"), 1)
  assert not reuses_current_logp(rl(), 2)  # two mini-batches, or two iterations
  assert not reuses_current_logp(RLConfig(objective="ppo", group_size=1, ppo=PPOConfig()), 1)  # GAE reads old_logp
  with pytest.raises(ConfigError, match="rl.old_logp"):
    rl(old_logp="never")
  with pytest.raises(ConfigError, match="set one of them"):
    rl(micro_batch_size=2, micro_batch_tokens=256)


def _count_calls(fn):
  calls = []
  def counted(*a, **k):
    calls.append(1)
    return fn(*a, **k)
  return counted, calls


def test_rl_update_without_the_old_logp_pass_equals_recomputing(params):
  batch = _host_batch("luffy")
  opt = optax.sgd(0.5)
  out = {}
  for on in (False, True):
    step, logp = make_rl_fns(opt, objective="luffy", loss_kwargs=LOSS_KW["luffy"], fwd_kwargs=FWD, on_policy=on)
    logp, calls = _count_calls(logp)
    out[on] = rl_update(init_state(params, opt, 0), None, batch, step_fn=step, logp_fn=logp, beta=0.0,
                        num_iterations=1, on_policy=on)
    assert len(calls) == (0 if on else 1)
  _close(out[True][0]["params"], out[False][0]["params"])
  assert abs(out[True][1]["loss"] - out[False][1]["loss"]) <= 1e-6
  with pytest.raises(ValueError, match="num_iterations=2"):
    rl_update(init_state(params, opt, 0), None, batch, step_fn=step, logp_fn=logp, beta=0.0, num_iterations=2,
              on_policy=True)


def _plan_update(params, old_logp: str, mini_batch_size: int, micro_batch_size: int, objective: str = "luffy"):
  """(state after UpdatePlan.update, metrics, calls of its logp_fn) on the 8-row batch (4 prompts x 2)."""
  sections = {"luffy": {"luffy": LuffyConfig()}, "grpo": {}}[objective]
  rl = RLConfig(objective=objective, prompts_per_step=4, group_size=2, max_new_tokens=16, entropy_coef=0.01,
                mini_batch_size=mini_batch_size, micro_batch_size=micro_batch_size, old_logp=old_logp, **sections)
  opt = optax.sgd(0.5)
  logp, calls = _count_calls(jax.jit(functools.partial(completion_logp, **FWD)))
  plan = UpdatePlan(rl, optimizer=opt, objective=objective, loss_kwargs=rl.objective_entry.kwargs(rl),
                    fwd_kwargs=FWD, logp_fn=logp, pad_id=0)
  state, metrics = plan.update(init_state(params, opt, 0), None, _host_batch(objective))
  return state, metrics, len(calls)


def test_plan_with_one_mini_batch_skips_the_pass_and_equals_recomputing(params):
  auto, m_auto, calls_auto = _plan_update(params, "auto", 0, 3)  # 8 rows in micro-batches of 3 (3 micro-batches)
  rec, m_rec, calls_rec = _plan_update(params, "recompute", 0, 3)
  assert calls_auto == 0 and calls_rec == 3
  _close(auto["params"], rec["params"])
  assert abs(m_auto["loss"] - m_rec["loss"]) <= 1e-6 and m_auto["off_policy_prob"] > 0
  # row micro-batches add up to the whole batch's update (rl_update, one pass)
  step, logp = make_rl_fns(optax.sgd(0.5), objective="luffy", loss_kwargs=LOSS_KW["luffy"],
                           fwd_kwargs=FWD)
  whole, _ = rl_update(init_state(params, optax.sgd(0.5), 0), None, _host_batch("luffy"), step_fn=step,
                       logp_fn=logp, beta=0.0, num_iterations=1)
  _close(auto["params"], whole["params"], tol=1e-5)


def test_plan_with_two_mini_batches_recomputes_old_logp(params):
  auto, m_auto, calls_auto = _plan_update(params, "auto", 2, 0, objective="grpo")
  rec, _, calls_rec = _plan_update(params, "recompute", 2, 0, objective="grpo")
  assert calls_auto == calls_rec == 2  # one old_logp pass a mini-batch: the skip is not taken
  _close(auto["params"], rec["params"])
  assert abs(m_auto["ratio_mean"] - 1.0) > 1e-6  # the 2nd mini-batch's ratio is to the pre-update policy
