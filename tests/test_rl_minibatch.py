"""Mini-/micro-batched RL updates (fineflax.rl.micro, fineflax.rl.minibatch, fineflax.train.grad_accum):
packing keeps every row's log-probs; the micro-batched gradient equals the whole-batch gradient for every
aggregation mode; the per-token weights reproduce `aggregate`; skip_grad_bound skips a step."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fineflax.models import init_params
from fineflax.rl import micro as M
from fineflax.rl.losses import AGG_MODES, aggregate, token_weights
from fineflax.rl.minibatch import UpdatePlan, split_rows  # noqa: F401  (reached by the fast tier)
from fineflax.rl.step import completion_logp, make_rl_fns, rl_loss
from fineflax.train.grad_accum import accumulate, apply_gradients, make_micro_grad
from test_train_rl_step import CFG, FWD, _batch, _lora

MAX_LEN = 16


@pytest.fixture(scope="module")
def base():
  return init_params(CFG, jax.random.PRNGKey(0))


def _host_batch():
  return {k: np.asarray(v) for k, v in _batch(b=8).items()}


@pytest.mark.fast
def test_token_weights_reproduce_every_aggregation_mode():
  rng = np.random.RandomState(0)
  loss = rng.randn(6, 10).astype(np.float32)
  mask = (rng.rand(6, 10) > 0.4).astype(np.float32)
  mask[2] = 0  # an empty row
  for mode in AGG_MODES:
    for num_rows in (None, 4.0):
      want = float(aggregate(jnp.asarray(loss), mask, mode, MAX_LEN, num_rows))
      got = float(np.sum(loss * mask * token_weights(mask, mode, MAX_LEN, num_rows)))
      np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=mode)
      # split into two parts along rows: the parts' weighted sums add up to the whole
      w = token_weights(mask, mode, MAX_LEN, num_rows)
      parts = [float(aggregate(jnp.asarray(loss[s]), mask[s], mode, weights=w[s])) for s in (slice(0, 3), slice(3, 6))]
      np.testing.assert_allclose(sum(parts), want, rtol=1e-5, atol=1e-7, err_msg=mode)


def test_packing_places_whole_rows_and_keeps_their_logp(base):
  batch = _host_batch()
  n = batch["completion"].shape[1]
  lengths = batch["attention_mask"].sum(1)
  budget = int(lengths.max()) + 10
  layout = M.pack_layout(batch["attention_mask"], n, budget, devices=2)
  mbs = M.pack(batch, layout, pad_id=0)
  assert len(mbs) == layout.num_micro >= 2 and all(mb["tokens"].shape == (2, budget) for mb in mbs)
  packed = np.concatenate([mb["segment_ids"] for mb in mbs])
  assert packed.max() >= 2  # some packed row holds several sequences
  assert sum(int((mb["attention_mask"]).sum()) for mb in mbs) == int(lengths.sum())  # no token lost or padded in
  lora = _lora(base, b_scale=0.05)
  logp_fn = jax.jit(functools.partial(completion_logp, **FWD))
  want = np.asarray(logp_fn(lora, base, batch)[0])
  got = M.unpack([logp_fn(lora, base, mb)[0] for mb in mbs], layout)
  real = batch["attention_mask"][:, -n:] > 0
  np.testing.assert_allclose(got[real], want[real], atol=2e-5)
  assert np.all(got[~real] == 0)
  # per-row fields are broadcast over the row's completion positions, the mask moves with its tokens
  packed_mask = M.unpack([mb["mask"] for mb in mbs], layout)
  np.testing.assert_array_equal(packed_mask, batch["mask"] * real)
  adv = M.unpack([mb["advantages"] for mb in mbs], layout)
  np.testing.assert_array_equal(adv, np.where(real, batch["advantages"][:, None], 0))
  with pytest.raises(ValueError, match=r"config.rl.micro_batch_tokens=8: row \d+ holds"):
    M.pack_layout(batch["attention_mask"], n, 8)


@pytest.fixture(scope="module")
def grads_by_mode(base):
  """{mode: (whole-batch grads, micro-batched grads, whole loss, micro loss)}: the reference is jax.jacrev
  of `rl_loss` with each mode's own `aggregate` (one compile for the five); the micro-batched one packs the
  batch into 3+ micro-batches and accumulates with the whole batch's token weights (one compile for all)."""
  batch = _host_batch()
  n = batch["completion"].shape[1]
  lora_old = _lora(base, b_scale=0.02)
  batch["old_logp"] = np.asarray(completion_logp(lora_old, base, batch, **FWD)[0])
  batch["ref_logp"] = np.asarray(completion_logp(None, base, batch, **FWD)[0])
  lora = _lora(base, b_scale=0.03, seed=1)
  kw = lambda mode: dict(epsilon_low=0.2, epsilon_high=0.28, beta=0.04, entropy_coef=0.01, agg_mode=mode,
                         max_len=MAX_LEN, gamma=0.1)  # LUFFY: mixed on/off-policy rows, KL and entropy terms
  loss = lambda mode, lo, b: rl_loss(lo, base, b, objective="luffy", loss_kwargs=kw(mode), fwd_kwargs=FWD)[0]
  all_modes = lambda lo: jnp.stack([loss(mode, lo, batch) for mode in AGG_MODES])
  whole_loss = np.asarray(jax.jit(all_modes)(lora))
  whole = jax.jit(jax.jacrev(all_modes))(lora)
  layout = M.pack_layout(batch["attention_mask"], n, int(batch["attention_mask"].sum(1).max()) + 4)
  assert layout.num_micro >= 3
  # the mode only enters through the weights: one compiled micro-step for every mode
  micro = make_micro_grad(functools.partial(rl_loss, objective="luffy", loss_kwargs=kw("token-mean"), fwd_kwargs=FWD))
  out = {}
  for i, mode in enumerate(AGG_MODES):
    b = dict(batch, loss_weights=token_weights(batch["mask"], mode, MAX_LEN),
             num_tokens=np.float32(batch["mask"].sum()))
    g, metrics = accumulate(micro, lora, base, M.pack(b, layout, pad_id=0))
    out[mode] = (jax.tree.map(lambda x: x[i], whole), g, whole_loss[i], float(metrics["loss"]))
  return out


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batched_gradient_equals_whole_batch_gradient(grads_by_mode, mode):
  whole, micro, whole_loss, micro_loss = grads_by_mode[mode]
  np.testing.assert_allclose(micro_loss, whole_loss, rtol=1e-5)
  scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(whole))
  assert scale > 1e-4  # a gradient that could differ
  for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(micro)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6 * scale)


@pytest.mark.fast
def test_apply_gradients_skips_a_step_over_the_bound_or_non_finite():
  params = {"w": jnp.ones((3,))}
  opt = optax.adam(0.1)
  state = opt.init(params)
  grads = {"w": jnp.full((3,), 2.0)}  # norm 2 sqrt(3) ~ 3.46
  new, new_state, m = apply_gradients(params, state, grads, opt, skip_grad_bound=3.0)
  assert float(m["skipped"]) == 1.0 and float(m["grad_norm"]) == pytest.approx(2 * 3 ** 0.5)
  np.testing.assert_array_equal(new["w"], params["w"])
  for a, b in zip(jax.tree.leaves(new_state), jax.tree.leaves(state)):
    np.testing.assert_array_equal(a, b)  # moments and step count unchanged
  new, new_state, m = apply_gradients(params, state, grads, opt, skip_grad_bound=4.0)
  assert float(m["skipped"]) == 0.0 and not np.allclose(new["w"], params["w"])
  _, _, m = apply_gradients(params, state, {"w": jnp.array([1.0, jnp.nan, 0.0])}, opt, skip_grad_bound=4.0)
  assert float(m["skipped"]) == 1.0
  _, _, m = apply_gradients(params, state, grads, opt)  # off: no skipped metric
  assert "skipped" not in m


def test_rl_step_with_skip_grad_bound_keeps_lora_and_counts_the_step(base):
  batch = {k: jnp.asarray(v) for k, v in _batch().items()}
  lora = _lora(base, b_scale=0.01)
  batch = dict(batch, old_logp=completion_logp(lora, base, batch, **FWD)[0])
  loss_kwargs = dict(epsilon_low=0.2, epsilon_high=0.28, beta=0.0, entropy_coef=0.0, agg_mode="token-mean")
  opt = optax.adam(1e-2)
  state = {"step": jnp.zeros((), jnp.int32), "params": lora, "opt_state": opt.init(lora), "rng": jax.random.PRNGKey(0)}
  step, _ = make_rl_fns(opt, objective="grpo", loss_kwargs=loss_kwargs, fwd_kwargs=FWD, skip_grad_bound=1e-9)
  new, metrics = step(state, base, batch)
  assert float(metrics["skipped"]) == 1.0 and int(new["step"]) == 1
  for a, b in zip(jax.tree.leaves(new["params"]), jax.tree.leaves(lora)):
    np.testing.assert_array_equal(a, b)
