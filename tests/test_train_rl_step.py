"""rl_step on a tiny random model: only LoRA changes, the loss on a fixed batch falls, KL is 0 at LoRA=0."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fineflax.models import ModelConfig, init_params
from fineflax.rl.batch import build_rl_batch
from fineflax.rl.step import completion_logp, make_rl_fns, rl_loss

CFG = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, eos_token_ids=(1,))


def _lora(params, r=4, seed=0, b_scale=0.0):
  keys = iter(jax.random.split(jax.random.PRNGKey(seed), 14))
  out = {}
  for name in ("q", "v", "down"):
    k = params["layers"][name]["kernel"]
    L, i, o = k.shape
    out[name] = {"a": 0.1 * jax.random.normal(next(keys), (L, i, r)),
                 "b": b_scale * jax.random.normal(next(keys), (L, r, o))}
  return out


def _batch(seed=0, b=8):
  rng = np.random.RandomState(seed)
  prompts = [list(rng.randint(2, 97, rng.randint(3, 9))) for _ in range(b)]
  comps = [list(rng.randint(2, 97, rng.randint(2, 12))) for _ in range(b)]
  masks = [[1.0] * len(c) for c in comps]
  masks[0][:2] = [0.0, 0.0]  # inserted tool text
  batch = build_rl_batch(prompts, comps, masks, pad_id=0, width_multiple=8)
  batch["advantages"] = rng.randn(b).astype(np.float32)
  batch["is_off_policy"] = np.arange(b) % 4 == 0
  return {k: jnp.asarray(v) for k, v in batch.items()}


@pytest.fixture(scope="module")
def base():
  return init_params(CFG, jax.random.PRNGKey(0))


FWD = dict(model_config=CFG, lora_scale=2.0)
LOSS = dict(epsilon_low=0.2, epsilon_high=0.28, beta=0.04, entropy_coef=0.0, agg_mode="token-mean")


def test_completion_logp_matches_full_forward(base):
  from fineflax.models import forward
  batch = _batch()
  logp, _ = completion_logp(None, base, batch, **FWD)
  logits = forward(base, CFG, batch["tokens"], positions=batch["positions"],
                   attention_mask=batch["attention_mask"])
  n = batch["completion"].shape[1]
  ref = jax.nn.log_softmax(logits[:, -n - 1:-1], -1)
  ref = jnp.take_along_axis(ref, batch["completion"][..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(logp), np.asarray(ref), atol=1e-5)


def test_kl_zero_when_lora_is_zero(base):
  batch = _batch()
  lora = _lora(base)  # b = 0: the adapted model is the base
  old = completion_logp(lora, base, batch, **FWD)[0]
  batch = dict(batch, old_logp=old, ref_logp=completion_logp(None, base, batch, **FWD)[0])
  _, metrics = rl_loss(lora, base, batch, objective="grpo", loss_kwargs=LOSS, fwd_kwargs=FWD)
  assert abs(float(metrics["kl"])) < 1e-6


@pytest.mark.parametrize("objective", ["grpo", "luffy"])
def test_rl_step_changes_only_lora_and_lowers_loss(base, objective):
  batch = _batch()
  lora = _lora(base, b_scale=0.01)
  old = completion_logp(lora, base, batch, **FWD)[0]
  batch = dict(batch, old_logp=old, ref_logp=completion_logp(None, base, batch, **FWD)[0])
  loss_kwargs = dict(LOSS) if objective == "grpo" else dict(LOSS, gamma=0.1)
  optimizer = optax.sgd(0.05)
  step, _ = make_rl_fns(optimizer, objective=objective, loss_kwargs=loss_kwargs, fwd_kwargs=FWD)
  state = {"step": jnp.int32(0), "params": lora, "opt_state": optimizer.init(lora),
           "rng": jax.random.PRNGKey(0)}
  base_before = jax.tree.map(np.array, base)
  lora_before = jax.tree.map(np.array, lora)
  loss0 = float(rl_loss(lora, base, batch, objective=objective, loss_kwargs=loss_kwargs,
                        fwd_kwargs=FWD)[0])
  for _ in range(3):
    state, _ = step(state, base, batch)
  loss1 = float(rl_loss(state["params"], base, batch, objective=objective, loss_kwargs=loss_kwargs,
                        fwd_kwargs=FWD)[0])
  assert loss1 < loss0 - 1e-4
  jax.tree.map(np.testing.assert_array_equal, base_before, jax.tree.map(np.array, base))
  changed = jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)), lora_before, state["params"])
  assert all(jax.tree.leaves(changed))


def test_zero_advantage_and_unit_ratio_give_zero_gradient(base):
  batch = _batch()
  lora = _lora(base, b_scale=0.01)
  old = completion_logp(lora, base, batch, **FWD)[0]
  batch = dict(batch, old_logp=old, advantages=jnp.zeros_like(batch["advantages"]))
  loss_kwargs = dict(LOSS, beta=0.0)
  grads = jax.grad(lambda lo: rl_loss(lo, base, batch, objective="grpo", loss_kwargs=loss_kwargs,
                                      fwd_kwargs=FWD)[0])(lora)
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) == 0.0


def test_masked_tokens_get_no_gradient(base):
  """Changing a masked (tool-inserted) completion token's log-prob target leaves the loss unchanged."""
  batch = _batch()
  lora = _lora(base, b_scale=0.01)
  batch = dict(batch, old_logp=completion_logp(lora, base, batch, **FWD)[0])
  kw = dict(objective="grpo", loss_kwargs=dict(LOSS, beta=0.0), fwd_kwargs=FWD)
  loss_a = rl_loss(lora, base, batch, **kw)[0]
  old = np.array(batch["old_logp"])
  old[0, :2] += 5.0  # masked positions of row 0
  loss_b = rl_loss(lora, base, dict(batch, old_logp=jnp.asarray(old)), **kw)[0]
  assert float(loss_a) == float(loss_b)


def test_a_new_objective_is_one_table_entry_and_one_loss(base, monkeypatch):
  """Adding an objective: register an `Objective` (loss + batch fields + config -> kwargs); the jitted
  step, the config validation and the loss dispatch need nothing else."""
  import ml_collections

  from fineflax.rl import objectives as O
  from fineflax.rl.config import validate_rl
  from fineflax.rl.losses import aggregate

  def reinforce(logp, entropy, batch, scale):  # -A·logp, token-mean
    loss = aggregate(-batch["advantages"][:, None] * logp * scale, batch["mask"], "token-mean")
    return loss, {"loss": loss}

  monkeypatch.setitem(O.OBJECTIVES, "reinforce", O.Objective(reinforce, (), lambda rl: {"scale": rl.scale}))
  rl = ml_collections.ConfigDict({"objective": "reinforce", "scale": 2.0})
  obj = validate_rl(rl)
  batch = _batch(4)
  lora = _lora(base, b_scale=0.1)
  loss, _ = rl_loss(lora, base, batch, objective="reinforce", loss_kwargs=obj.kwargs(rl), fwd_kwargs=FWD)
  logp, _ = completion_logp(lora, base, batch, **FWD)
  m = np.asarray(batch["mask"])
  want = (-np.asarray(batch["advantages"])[:, None] * np.asarray(logp) * 2.0 * m).sum() / m.sum()
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  step, _ = make_rl_fns(optax.sgd(1e-2), objective="reinforce", loss_kwargs=obj.kwargs(rl), fwd_kwargs=FWD)
  state = {"step": jnp.zeros((), jnp.int32), "params": lora, "opt_state": optax.sgd(1e-2).init(lora),
           "rng": jax.random.PRNGKey(0)}
  new, metrics = step(state, base, batch)
  assert int(new["step"]) == 1 and np.isfinite(float(metrics["loss"]))
