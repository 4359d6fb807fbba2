"""Full-parameter steps donate their train state (`fineflax.train.trainable.Trainable.donate`): after one
step the old state's arrays are deleted, the losses and parameters of a few steps equal the undonated
steps', a non-finite step leaves the donated params unchanged, and the loop then keeps the step's output."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fineflax.models import init_params
from fineflax.rl.step import make_rl_fns
from fineflax.train.distill_step import make_distill_fn
from fineflax.train.grad_accum import apply_gradients
from fineflax.train.loop import donated
from fineflax.train.sft_step import make_sft_fns
from fineflax.train.state import init_state
from test_train_rl_step import CFG, FWD, LOSS, _batch

OPT = optax.adamw(1e-2)


def _state():
  return init_state(init_params(CFG, jax.random.PRNGKey(0)), OPT, 0)


def _sft_batch(batch):
  """The [1, B, S] SFT layout of an RL batch (targets = next token, loss on the completion)."""
  tokens = np.asarray(batch["tokens"])
  n = batch["completion"].shape[1]
  targets = np.concatenate([tokens[:, 1:], np.zeros_like(tokens[:, :1])], 1)
  loss_mask = np.zeros(tokens.shape, np.float32)
  loss_mask[:, -n - 1:-1] = np.asarray(batch["mask"])
  return {k: jnp.asarray(v)[None] for k, v in dict(tokens=tokens, targets=targets, loss_mask=loss_mask,
                                                   attention_mask=batch["attention_mask"],
                                                   positions=batch["positions"]).items()}


def _steps():
  """name -> (make(donate) -> step(state, batch), the batch)."""
  rl_batch = _batch()
  return {
      "rl": (lambda donate: (lambda st, b: make_rl_fns(OPT, objective="grpo", loss_kwargs=LOSS, fwd_kwargs=FWD,
                                                       donate=donate)[0](st, None, b)),
             dict(rl_batch, old_logp=-jnp.ones_like(rl_batch["mask"]), ref_logp=-jnp.ones_like(rl_batch["mask"]))),
      "sft": (lambda donate: (lambda st, b: make_sft_fns(OPT, donate=donate, model_config=CFG, lora_scale=1.0)[0](
          st, None, b)), _sft_batch(rl_batch)),
      "distill": (lambda donate: (lambda st, b: make_distill_fn(OPT, model_config=CFG, donate=donate,
                                                                lora_scale=1.0)(st, None, _teacher(), None, b)),
                  {k: rl_batch[k] for k in ("tokens", "attention_mask", "positions", "mask")}),
  }


def _teacher():
  return init_params(CFG, jax.random.PRNGKey(5))


@pytest.mark.parametrize("name", ["rl", "sft", "distill"])
def test_a_donating_full_step_deletes_the_old_state_and_trains_as_the_kept_one(name):
  make, batch = _steps()[name]
  kept_step, donating_step = make(False), make(True)
  kept, given = _state(), _state()
  old_leaves = jax.tree.leaves(given["params"])
  losses = {"kept": [], "donated": []}
  for i in range(3):
    kept, m1 = kept_step(kept, batch)
    before = given
    given, m2 = donating_step(given, batch)
    losses["kept"].append(float(m1["loss"]))
    losses["donated"].append(float(m2["loss"]))
    if i == 0:
      assert all(x.is_deleted() for x in old_leaves) and donated(before)
  assert not donated(given)
  np.testing.assert_allclose(losses["donated"], losses["kept"], rtol=1e-6, atol=1e-7)
  assert losses["kept"][-1] < losses["kept"][0]  # the steps train
  for a, b in zip(jax.tree.leaves(given["params"]), jax.tree.leaves(kept["params"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_a_non_finite_donated_step_leaves_params_and_moments_unchanged():
  make, batch = _steps()["rl"]
  state = _state()
  want = jax.tree.map(lambda x: np.array(x, copy=True), state)  # no view that would pin the buffers
  poisoned = dict(batch, advantages=batch["advantages"].at[0].set(jnp.nan))
  new, m = make(True)(state, poisoned)
  assert not np.isfinite(float(m["loss"]))
  assert donated(state)
  for key in ("params", "opt_state"):
    for a, b in zip(jax.tree.leaves(new[key]), jax.tree.leaves(want[key])):
      np.testing.assert_array_equal(np.asarray(a), b)


@pytest.mark.fast
def test_apply_gradients_skip_nonfinite_without_a_bound_reports_no_skipped_metric():
  params = {"w": jnp.ones(3)}
  opt = optax.sgd(1.0)
  p, _, m = apply_gradients(params, opt.init(params), {"w": jnp.full(3, jnp.nan)}, opt, skip_nonfinite=True)
  np.testing.assert_array_equal(np.asarray(p["w"]), np.ones(3))
  assert set(m) == {"grad_norm"}
  p, _, _ = apply_gradients(params, opt.init(params), {"w": jnp.ones(3)}, opt, skip_nonfinite=True,
                            loss=jnp.float32(jnp.inf))  # a non-finite loss with finite grads: skipped too
  np.testing.assert_array_equal(np.asarray(p["w"]), np.ones(3))
  p, _, _ = apply_gradients(params, opt.init(params), {"w": jnp.ones(3)}, opt, skip_nonfinite=True)
  np.testing.assert_array_equal(np.asarray(p["w"]), np.zeros(3))


@pytest.mark.fast
def test_the_loop_keeps_a_donating_steps_output_when_its_loss_is_not_finite(tmp_path):
  """A donated state is gone after the step: on a NaN loss the loop stops with the step's own output, which
  the guarded update left equal to the last good state, and the run's state stays readable."""
  import ml_collections

  from fineflax.train.grad_accum import step_state
  from fineflax.train.loop import Hooks, train_loop
  opt = optax.sgd(0.1)
  target = jnp.arange(4.0)

  def fn(state, poison):
    loss_fn = lambda p: jnp.sum(jnp.square(p["w"] - target)) * poison
    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    state, m = step_state(state, grads, opt, skip_nonfinite=True, loss=loss)
    return state, dict(m, loss=loss)

  step_fn = jax.jit(fn, donate_argnums=(0,))
  seen = []

  def step(state, i):
    seen.append(state)
    return step_fn(state, jnp.float32(jnp.nan if i == 3 else 1.0))

  config = ml_collections.ConfigDict({"checkpoint": {"every": 100, "keep_last": 1, "keep_best": 0}, "seed": 0})
  state = init_state({"w": jnp.zeros(4)}, opt, 0)
  result = train_loop(Hooks(step=step), state, config, str(tmp_path), num_steps=5, desc="toy", eval_every=100)
  assert result.status == "stopped: non-finite loss nan at step 3" and result.step == 2
  assert donated(seen[-1]) and not donated(result.state)
  w2 = np.asarray(target) * (1 - (1 - 0.2) ** 2)  # two SGD steps of lr 0.1 on |w - target|^2 from 0
  np.testing.assert_allclose(np.asarray(result.state["params"]["w"]), w2, rtol=1e-6)
