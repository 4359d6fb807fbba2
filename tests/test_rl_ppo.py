"""PPO (fineflax.rl.ppo): GAE, whitening, KL-in-reward and the value loss against NumPy transcriptions of
verl's `core_algos.py` / `torch_functional.py` and Search-R1's fork (`ray_trainer.apply_kl_penalty`, its
older mask-free GAE); a critic step on a tiny model lowers the value loss; the arithmetic RL job runs PPO."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.config_checks import ConfigError
from fineflax.rl import ppo as P
from fineflax.rl.config import RLConfig


# ----------------------------------------------------------------------------- NumPy transcriptions

def np_masked_mean(x, m):
  return (x * m).sum() / m.sum()


def np_masked_whiten(x, m):  # verl utils/torch_functional.masked_whiten (masked_var unbiased)
  mean = np_masked_mean(x, m)
  var = np_masked_mean((x - mean) ** 2, m) * (m.sum() / (m.sum() - 1))
  return (x - mean) / np.sqrt(var + 1e-8)


def np_gae_verl(rewards, values, mask, gamma, lam):  # verl compute_gae_advantage_return (observation skipping)
  nextvalues, lastgaelam, rev = 0.0, 0.0, []
  for t in reversed(range(rewards.shape[1])):
    delta = rewards[:, t] + gamma * nextvalues - values[:, t]
    lastgaelam_ = delta + gamma * lam * lastgaelam
    nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
    lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
    rev.append(lastgaelam)
  adv = np.stack(rev[::-1], 1)
  return np_masked_whiten(adv, mask), adv + values


def np_gae_search_r1(rewards, values, mask, gamma, lam):  # Search-R1's fork: no mask in the recursion
  lastgaelam, rev, n = 0.0, [], rewards.shape[1]
  for t in reversed(range(n)):
    nextvalues = values[:, t + 1] if t < n - 1 else 0.0
    delta = rewards[:, t] + gamma * nextvalues - values[:, t]
    lastgaelam = delta + gamma * lam * lastgaelam
    rev.append(lastgaelam)
  adv = np.stack(rev[::-1], 1)
  return np_masked_whiten(adv, mask), adv + values


def np_kl_penalty(logp, ref, kind):  # verl kl_penalty_forward
  if kind == "kl":
    return logp - ref
  if kind == "abs":
    return np.abs(logp - ref)
  if kind == "mse":
    return 0.5 * (logp - ref) ** 2
  kl = np.clip(ref - logp, -20, 20)
  return np.clip(np.exp(kl) - kl - 1, -10, 10)


def np_value_loss(vpreds, returns, values, mask, cliprange_value):  # verl compute_value_loss (token-mean)
  vpredclipped = np.clip(vpreds, values - cliprange_value, values + cliprange_value)
  l1, l2 = (vpreds - returns) ** 2, (vpredclipped - returns) ** 2
  return 0.5 * np_masked_mean(np.maximum(l1, l2), mask), np_masked_mean((l2 > l1).astype(np.float64), mask)


def _rollout(seed=0, b=6, n=12):
  """Right-padded completions with an inserted information block (policy mask 0) inside some rows."""
  rng = np.random.RandomState(seed)
  lengths = rng.randint(3, n + 1, b)
  resp = (np.arange(n)[None] < lengths[:, None]).astype(np.float32)
  mask = resp.copy()
  mask[0, 1:3] = 0  # tool text: out of the policy loss and the KL penalty, inside GAE (Search-R1)
  mask[3, 0:2] = 0
  return dict(rewards=rng.rand(b).astype(np.float32), values=rng.randn(b, n).astype(np.float32),
              old_logp=-rng.rand(b, n).astype(np.float32), ref_logp=-rng.rand(b, n).astype(np.float32),
              mask=mask, response_mask=resp)


@pytest.mark.fast
@pytest.mark.parametrize("kind,gamma,lam", [("kl", 1.0, 1.0), ("low_var_kl", 0.99, 0.95), ("mse", 0.9, 0.8),
                                            ("abs", 1.0, 0.9)])
def test_ppo_targets_equal_the_numpy_transcription_of_verl_and_search_r1(kind, gamma, lam):
  batch = _rollout()
  cfg = types.SimpleNamespace(gamma=gamma, lam=lam, kl_coef=0.05, kl_penalty=kind, kl_in_reward=True)
  adv, ret, metrics = P.ppo_targets(batch, cfg)
  # Search-R1 apply_kl_penalty: token_level_scores (score at the last response token) - beta * kld * info_mask
  resp, info = batch["response_mask"], batch["mask"]
  scores = np.zeros_like(resp)
  last = resp.sum(1).astype(int) - 1
  scores[np.arange(len(last)), last] = batch["rewards"]
  kld = np_kl_penalty(batch["old_logp"], batch["ref_logp"], kind) * info
  rewards = scores - 0.05 * kld
  values = batch["values"] * resp  # verl compute_values masks the values
  want_adv, want_ret = np_gae_verl(rewards.astype(np.float64), values, resp, gamma, lam)
  np.testing.assert_allclose(adv, want_adv, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
  # with the full response mask (no holes) verl's recursion is the fork's mask-free one
  old_adv, old_ret = np_gae_search_r1(rewards.astype(np.float64), values, resp, gamma, lam)
  np.testing.assert_allclose(adv, old_adv, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(ret * resp, old_ret * resp, rtol=1e-5, atol=1e-5)
  want_kl = np.mean((kld * info).sum(1) / info.sum(1))
  assert metrics["critic_kl"] == pytest.approx(want_kl, rel=1e-5, abs=1e-7)


@pytest.mark.fast
def test_gae_skips_masked_tokens_as_verl_does():
  rng = np.random.RandomState(1)
  r, v = rng.randn(4, 9), rng.randn(4, 9)
  m = (rng.rand(4, 9) > 0.3).astype(np.float64)
  m[:, 0] = 1
  adv, ret = P.gae(r, v, m, 0.97, 0.9)
  want_adv, want_ret = np_gae_verl(r, v, m, 0.97, 0.9)
  np.testing.assert_allclose(np.asarray(P.masked_whiten(adv, m)), want_adv, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(ret), want_ret, rtol=1e-5, atol=1e-5)


@pytest.mark.fast
def test_value_loss_equals_the_numpy_transcription_of_verl():
  rng = np.random.RandomState(2)
  vpreds, returns, values = rng.randn(5, 7), rng.randn(5, 7), rng.randn(5, 7)
  m = (rng.rand(5, 7) > 0.3).astype(np.float64)
  loss, clipfrac = P.value_loss(jnp.asarray(vpreds), jnp.asarray(values), jnp.asarray(returns), m, 0.5)
  want_loss, want_frac = np_value_loss(vpreds, returns, values, m, 0.5)
  assert float(loss) == pytest.approx(want_loss, rel=1e-5)
  assert float(clipfrac) == pytest.approx(want_frac, rel=1e-5)
  assert 0 < want_frac < 1  # both branches taken


@pytest.mark.fast
def test_ppo_config_checks():
  rl = RLConfig.from_config({"objective": "ppo", "group_size": 1, "ppo": {"gamma": 0.99}})
  assert rl.ppo.gamma == 0.99 and rl.objective_entry.critic
  assert RLConfig.from_config({"objective": "ppo", "group_size": 1, "ppo": {"critic": "full"}}).ppo.critic == "full"
  with pytest.raises(ConfigError, match=r"config.rl.ppo.critic='half'"):
    RLConfig.from_config({"objective": "ppo", "ppo": {"critic": "half"}})
  with pytest.raises(ConfigError, match=r"config.rl.ppo.kl_penalty='k9'"):
    RLConfig.from_config({"objective": "ppo", "ppo": {"kl_penalty": "k9"}})
  with pytest.raises(ConfigError, match=r"config.rl.ppo is missing"):
    RLConfig.from_config({"objective": "ppo"})
  with pytest.raises(ConfigError, match=r"config.rl.group_size=1"):
    RLConfig.from_config({"objective": "grpo", "group_size": 1})
  with pytest.raises(ConfigError, match=r"config.rl.mini_batch_size=3: 0 \(= prompts_per_step\) or a divisor"):
    RLConfig.from_config({"prompts_per_step": 8, "mini_batch_size": 3})
  with pytest.raises(ConfigError, match=r"config.rl.micro_batch_tokens=64"):
    RLConfig.from_config({"max_new_tokens": 128, "micro_batch_tokens": 64})
  with pytest.raises(ConfigError, match=r"config.rl.skip_grad_bound=-1"):
    RLConfig.from_config({"skip_grad_bound": -1})


def test_a_full_critic_starts_where_a_lora_critic_starts_and_trains_its_copy():
  """A LoRA critic starts with B = 0, so its values are the base's: the full critic (a float32 copy of the
  base with the same head) gives the same values; a step moves the copy's weights, not the base's."""
  from fineflax.lora import LoraConfig
  from fineflax.models import init_params
  from fineflax.train.grad_accum import accumulate
  from test_train_rl_step import CFG, FWD, _batch
  base = init_params(CFG, jax.random.PRNGKey(0))
  opt = dict(num_steps=10, learning_rate=0.0, warmup_steps=0, end_lr_ratio=1.0, weight_decay=0.0, b1=0.9,
             b2=0.99, grad_clip=1.0)
  kw = dict(critic_lr=5e-3, critic_warmup_steps=0, cliprange_value=0.5, value_loss_coef=1.0)
  lora_c = P.Critic(types.SimpleNamespace(critic="lora", **kw), opt, fwd_kwargs=FWD)
  full_c = P.Critic(types.SimpleNamespace(critic="full", **kw), opt, fwd_kwargs=FWD)
  lora_s = lora_c.init(base, CFG, LoraConfig(r=4, alpha=8.0), seed=0)
  full_s = full_c.init(base, CFG, LoraConfig(r=4, alpha=8.0), seed=0)
  batch = {k: np.asarray(v) for k, v in _batch().items()}
  batch["response_mask"] = P.response_mask(batch)
  v_lora = np.asarray(lora_c.values(lora_s["params"], lora_c.base, batch))
  v_full = np.asarray(full_c.values(full_s["params"], full_c.base, batch))
  np.testing.assert_allclose(v_full, v_lora, atol=1e-5)
  assert full_c.base is None and "lora" not in full_s["params"]
  batch["values"] = v_full
  batch["returns"] = (batch["response_mask"] * 1.5).astype(np.float32)
  grads, _ = accumulate(full_c.micro, full_s["params"], full_c.base, [batch])
  new, _ = full_c.apply(full_s, grads)
  moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), new["params"]["model"], full_s["params"]["model"])
  assert max(jax.tree.leaves(moved)) > 0
  np.testing.assert_array_equal(np.asarray(jax.tree.leaves(base)[0]), np.asarray(jax.tree.leaves(
      init_params(CFG, jax.random.PRNGKey(0)))[0]))  # the base itself is untouched


def test_critic_steps_lower_the_value_loss_on_a_fixed_batch():
  from fineflax.lora import LoraConfig
  from fineflax.models import init_params
  from fineflax.train.grad_accum import accumulate
  from test_train_rl_step import CFG, FWD, _batch
  base = init_params(CFG, jax.random.PRNGKey(0))
  opt = dict(num_steps=10, learning_rate=0.0, warmup_steps=0, end_lr_ratio=1.0, weight_decay=0.0, b1=0.9,
             b2=0.99, grad_clip=1.0)
  ppo = types.SimpleNamespace(critic="lora", critic_lr=5e-3, critic_warmup_steps=0, cliprange_value=0.5,
                              value_loss_coef=1.0)
  critic = P.Critic(ppo, opt, fwd_kwargs=FWD)
  state = critic.init(base, CFG, LoraConfig(r=4, alpha=8.0), seed=0)
  batch = {k: np.asarray(v) for k, v in _batch().items()}
  batch["response_mask"] = P.response_mask(batch)
  batch["values"] = np.asarray(critic.values(state["params"], base, batch))
  batch["returns"] = np.where(batch["response_mask"] > 0, np.linspace(0.0, 2.0, batch["values"].shape[1]), 0.0
                              ).astype(np.float32)
  losses = []
  for _ in range(10):
    grads, m = accumulate(critic.micro, state["params"], base, [batch])
    losses.append(float(m["vf_loss"]))
    state, _ = critic.apply(state, grads)
  assert losses[-1] < 0.5 * losses[0], losses
  assert float(jnp.abs(state["params"]["lora"]["q"]["b"]).max()) > 0  # the critic's LoRA trains too


@pytest.mark.long
@pytest.mark.parametrize("mode", [{}, {"model.quant": "none", "train.params": "full", "rl.ppo.critic": "full"}],
                         ids=["lora", "full"])
def test_ppo_job_runs_with_mini_and_micro_batches(tiny_smol, tmp_path, mode):
  """2 steps of the arithmetic RL job with rl.objective=ppo (configs/grpo_arith.py:ppo,smoke), two
  mini-batches a step, packed micro-batches and a (never hit) skip bound: critic metrics are logged, the
  critic and the policy both change, and the checkpoint holds the critic. Full: the policy's and the full
  critic's steps donate their states (each optimizer step reads only the state the one before returned)."""
  from fineflax.jobs import rl as rl_job
  from fineflax.jobs.resolve import load_config
  over = {"model.source": tiny_smol, "rl.max_new_tokens": 8, "task.num_eval": 4, "task.num_train": 64,
          "eval_batch_size": 4, "rl.group_size": 2, "rl.mini_batch_size": 1, "rl.micro_batch_tokens": 160,
          "rl.skip_grad_bound": 1e6, "optimizer.learning_rate": 1e-2,
          "rl.mask_truncated": False,  # 8-token completions are all cut: they must enter the loss here
          **mode}
  c = load_config("configs/grpo_arith.py:ppo,smoke", [f"{k}={v}" for k, v in over.items()])
  job = rl_job.RLJob(c)
  before = jax.tree.map(np.asarray, job.learner.state)
  out = rl_job.run(c, str(tmp_path))
  assert out["exit_code"] == 0
  hist = out["history"]
  assert [h["step"] for h in hist] == [0, 1, 2]
  for key in ("loss", "vf_loss", "vf_clipfrac", "vpred_mean", "critic_kl", "critic_grad_norm", "grad_norm"):
    assert key in hist[-1] and np.isfinite(hist[-1][key]), key
  assert hist[-1]["skipped"] == 0.0
  after = out["job"].learner.state
  moved = lambda a, b: max(float(np.abs(np.asarray(x) - y).max())
                           for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert moved(after["critic"]["params"]["head"], before["critic"]["params"]["head"]) > 0
  assert moved(after["params"], before["params"]) > 0
