"""distill_step: the KL equals a NumPy transcription of the formula (full and top-k), only the student's
LoRA receives gradients and changes, and a step on a fixed batch lowers the KL."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fineflax.models import ModelConfig, forward, init_params
from fineflax.rl.batch import build_rl_batch
from fineflax.train.distill_step import Teacher, distill_loss, kl_full, kl_topk, make_distill_fn
from fineflax.train.state import init_state

CFG = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, eos_token_ids=(1,))
TAU = 1.7


def np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_kl(zt, zs, tau, k=0):
  """sum_v p_T(v) (log p_T(v) - log p_S(v)); top-k: p_T renormalised over its k largest logits."""
  zt, zs = np.asarray(zt, np.float64) / tau, np.asarray(zs, np.float64) / tau
  ls = np_log_softmax(zs)
  if k:
    idx = np.argsort(-zt, -1)[..., :k]
    lt = np_log_softmax(np.take_along_axis(zt, idx, -1))
    return (np.exp(lt) * (lt - np.take_along_axis(ls, idx, -1))).sum(-1)
  lt = np_log_softmax(zt)
  return (np.exp(lt) * (lt - ls)).sum(-1)


def _lora(params, r=4, seed=0, b_scale=0.0):
  keys = iter(jax.random.split(jax.random.PRNGKey(seed), 14))
  out = {}
  for name in ("q", "v", "down"):
    L, i, o = params["layers"][name]["kernel"].shape
    out[name] = {"a": 0.1 * jax.random.normal(next(keys), (L, i, r)),
                 "b": b_scale * jax.random.normal(next(keys), (L, r, o))}
  return out


def _batch(seed=0, b=4):
  rng = np.random.RandomState(seed)
  prompts = [list(rng.randint(2, 97, rng.randint(3, 9))) for _ in range(b)]
  comps = [list(rng.randint(2, 97, rng.randint(2, 10))) for _ in range(b)]
  masks = [[1.0] * len(c) for c in comps]
  masks[0][:2] = [0.0, 0.0]
  return {k: jnp.asarray(v) for k, v in build_rl_batch(prompts, comps, masks, pad_id=0,
                                                       width_multiple=8).items()}


@pytest.fixture(scope="module")
def base():
  return init_params(CFG, jax.random.PRNGKey(0))


@pytest.mark.fast
def test_kl_functions_match_numpy():
  rng = np.random.RandomState(0)
  zt, zs = 3 * rng.randn(5, 7, 50), 3 * rng.randn(5, 7, 50)
  np.testing.assert_allclose(np.asarray(kl_full(jnp.asarray(zt), jnp.asarray(zs), TAU)), np_kl(zt, zs, TAU),
                             rtol=1e-5, atol=1e-6)
  idx = np.argsort(-zt, -1)[..., :6]
  vals = np.take_along_axis(zt, idx, -1)
  # top-k given as log-probs at temperature 1 (an API's top_logprobs) = the same q_T as top-k logits
  lp = vals - np.log(np.exp(zt).sum(-1, keepdims=True))
  for given in (vals, lp):
    got = kl_topk(jnp.asarray(given), jnp.asarray(idx), jnp.asarray(zs), TAU)
    np.testing.assert_allclose(np.asarray(got), np_kl(zt, zs, TAU, k=6), rtol=1e-5, atol=1e-6)
  assert np.all(np_kl(zt, zs, TAU, k=6) >= 0)
  np.testing.assert_allclose(np_kl(zt, zs, TAU, k=50), np_kl(zt, zs, TAU), rtol=1e-10)


@pytest.mark.parametrize("top_k", [0, 5])
def test_distill_loss_matches_numpy_on_model_logits(base, top_k):
  """The loss = masked token mean of the NumPy KL of the two models' logits at the completion positions;
  the teacher reads another prompt (a longer one) with the same completion."""
  batch = _batch()
  t_batch = _batch()  # same completions, teacher prompt = 3 extra tokens in front
  rng = np.random.RandomState(5)
  extra = rng.randint(2, 97, (batch["tokens"].shape[0], 3))
  t_tokens = np.concatenate([extra, np.asarray(t_batch["tokens"])], 1)
  t_attn = np.concatenate([np.ones_like(extra), np.asarray(t_batch["attention_mask"])], 1)
  t_attn[np.asarray(t_batch["attention_mask"]).argmax(1) == 0] = t_attn[0]  # (rows all start padded)
  t_pos = np.maximum(np.cumsum(t_attn, 1) - 1, 0)
  batch = dict(batch, teacher_tokens=jnp.asarray(t_tokens), teacher_attention_mask=jnp.asarray(t_attn),
               teacher_positions=jnp.asarray(t_pos))
  student_lora, teacher_lora = _lora(base, seed=1, b_scale=0.05), _lora(base, seed=2, b_scale=0.3)
  teacher = Teacher(base, CFG, teacher_lora, 2.0)
  loss, _ = distill_loss(student_lora, base, teacher, batch, model_config=CFG, lora_scale=2.0, tau=TAU,
                         top_k=top_k, logits_chunk=3)
  n = batch["mask"].shape[1]
  zs = forward(base, CFG, batch["tokens"], positions=batch["positions"], attention_mask=batch["attention_mask"],
               lora=student_lora, lora_scale=2.0)[:, -n - 1:-1]
  zt = forward(base, CFG, jnp.asarray(t_tokens), positions=jnp.asarray(t_pos),
               attention_mask=jnp.asarray(t_attn), lora=teacher_lora, lora_scale=2.0)[:, -n - 1:-1]
  m = np.asarray(batch["mask"])
  ref = (np_kl(zt, zs, TAU, top_k) * m).sum() / m.sum()
  assert ref > 1e-3
  np.testing.assert_allclose(float(loss), ref, rtol=2e-4)


def test_gradients_reach_only_the_student_lora(base):
  batch = _batch(1)
  student_lora, teacher_lora = _lora(base, seed=1), _lora(base, seed=2, b_scale=0.3)

  def f(s_lora, t_lora, t_params):
    return distill_loss(s_lora, base, Teacher(t_params, CFG, t_lora, 2.0), batch, model_config=CFG,
                        lora_scale=2.0, tau=TAU, top_k=0)[0]
  gs, gt, gp = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(student_lora, teacher_lora, base)
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves((gt, gp)))
  assert float(optax.tree.norm(gs)) > 0

  opt = optax.adam(5e-2)
  step = make_distill_fn(opt, model_config=CFG, teacher_lora_scale=2.0, lora_scale=2.0, tau=TAU, top_k=5)
  state = init_state(student_lora, opt, 0)
  base_before = jax.tree.map(np.asarray, base)
  t_before = jax.tree.map(np.asarray, teacher_lora)
  losses = []
  for _ in range(6):
    state, metrics = step(state, base, base, teacher_lora, batch)
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0] - 0.05, losses  # descends (lr 5e-2, 6 steps)
  assert int(state["step"]) == 6
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, base), base_before)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, teacher_lora), t_before)
  assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(state["params"]),
                                                    jax.tree.leaves(student_lora)))


def test_vocabulary_mismatch_is_a_clear_error(base):
  other = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=8)
  t_params = init_params(other, jax.random.PRNGKey(1))
  with pytest.raises(ValueError, match="teacher vocabulary 50 != student vocabulary 97"):  # shapes only: traced
    jax.eval_shape(lambda: distill_loss(None, base, Teacher(t_params, other), _batch(), model_config=CFG,
                                        lora_scale=1.0))


@pytest.mark.parametrize("top_k,budget_rows", [(0, 2), (5, 4)])
def test_micro_batched_distill_step_equals_the_whole_batch_step(base, top_k, budget_rows):
  """config.train.micro_batch_tokens: the rows split into micro-batches (the last padded with mask-0 rows,
  as the job does) give the whole batch's loss, KL metrics, gradient norm and parameters after one step."""
  from fineflax.rl.batch import pad_rows
  from fineflax.rl.minibatch import split_rows
  from fineflax.train.distill_step import make_distill_micro_step, micro_rows
  batch = {k: np.asarray(v) for k, v in _batch(3, b=6).items()}
  student_lora, teacher_lora = _lora(base, seed=1, b_scale=0.05), _lora(base, seed=2, b_scale=0.3)
  opt = optax.sgd(0.5)
  kw = dict(model_config=CFG, teacher_lora_scale=2.0, lora_scale=2.0, tau=TAU, top_k=top_k, logits_chunk=4)
  whole, m_whole = make_distill_fn(opt, **kw)(init_state(student_lora, opt, 0), base, base, teacher_lora, batch)
  width = batch["tokens"].shape[1]
  rows = micro_rows(6, width, budget_rows * width + width // 2, devices=1)
  assert rows == budget_rows
  mbs = split_rows(pad_rows(batch, rows), rows)
  assert len(mbs) == -(-6 // rows) and sum(mb["mask"].sum() for mb in mbs) == batch["mask"].sum()
  micro, m_micro = make_distill_micro_step(opt, **kw)(init_state(student_lora, opt, 0), base, base, teacher_lora,
                                                        mbs)
  for k in ("loss", "kl", "kl_max", "loss_tokens", "grad_norm"):
    np.testing.assert_allclose(float(m_micro[k]), float(m_whole[k]), rtol=1e-6, atol=1e-7, err_msg=k)
  assert float(m_whole["grad_norm"]) > 1e-3
  for a, b in zip(jax.tree.leaves(micro["params"]), jax.tree.leaves(whole["params"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


@pytest.mark.fast
def test_a_distillation_row_longer_than_the_micro_batch_budget_names_the_knob():
  from fineflax.train.distill_step import micro_rows
  with pytest.raises(ValueError, match=r"config.train.micro_batch_tokens=40: a distillation row holds 48 tokens"):
    micro_rows(8, 48, 40)
  assert micro_rows(8, 48, 200, devices=2) == 8  # 4 rows a device x 2 devices
  assert micro_rows(3, 48, 1000, devices=2) == 4  # never more rows than the batch needs
