"""PPO with a value model and GAE (`rl.objective = "ppo"`, Search-R1's main results): the math, transcribed
from verl `verl/trainer/ppo/core_algos.py` and Search-R1's fork (`ray_trainer.py`), and the critic.

Per row (completion tokens t = 0 .. N-1; c = the row's completion length):
  m_resp[t]   1 on every real completion token, inserted tool text included (Search-R1: GAE, whitening and
              the value loss read `attention_mask`, not `info_mask`)
  m[t]        the batch's `mask`: policy tokens only (Search-R1 `state_masking`: the KL penalty reads
              `info_mask`, the policy loss `loss_mask = info_mask`)
  score       the row's reward, at its last completion token (verl's reward managers)
  r[t] = score·[t = c-1] - kl_coef · kl_penalty(old_logp, ref_logp)[t] · m[t]     (`apply_kl_penalty`,
              fixed kl_ctrl; only with kl_in_reward)
  delta[t] = r[t] + gamma·V'[t+1] - V[t];  A'[t] = delta[t] + gamma·lam·A'[t+1]
              (`compute_gae_advantage_return`; at a token with m_resp = 0, V' and A' pass through
              unchanged, verl's observation skipping: with m_resp all ones inside a row this is the fork's
              plain recursion)
  returns = A' + V;  A = masked_whiten(A', m_resp) over the whole batch (mean, unbiased var, rsqrt(var + 1e-8))
  value loss = 0.5 · token-mean over m_resp of max((v - R)^2, (clip(v, V - c_v, V + c_v) - R)^2)
              (`compute_value_loss`, cliprange_value c_v)
The policy loss is the clipped surrogate of `fineflax.rl.losses.grpo_loss` with A per token.
The critic (`ppo.critic = "lora"`): its own LoRA on the frozen base and a value head [H, 1] + bias on the
final-norm hidden state (verl's critic is AutoModelForTokenClassification with one label); V[t] is read
at the position predicting completion token t. Its own AdamW (the run's optimizer settings with
`critic_lr`, `critic_warmup_steps`).
"""
from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np

from fineflax import lora as lora_lib
from fineflax.rl.losses import aggregate, masked_mean
from fineflax.rl.step import completion_hidden
from fineflax.train.grad_accum import apply_gradients, make_micro_grad
from fineflax.train.optim import make_optimizer

KL_PENALTIES = ("kl", "abs", "mse", "low_var_kl")


def kl_penalty(logp, ref_logp, kind: str):
  """verl `kl_penalty` per token: kl logp - ref; abs |logp - ref|; mse 0.5 (logp - ref)^2;
  low_var_kl (k3) clamp(exp(d) - d - 1, -10, 10) with d = clamp(ref - logp, -20, 20)."""
  if kind == "kl":
    return logp - ref_logp
  if kind == "abs":
    return jnp.abs(logp - ref_logp)
  if kind == "mse":
    return 0.5 * jnp.square(logp - ref_logp)
  if kind == "low_var_kl":
    d = jnp.clip(ref_logp - logp, -20.0, 20.0)
    return jnp.clip(jnp.exp(d) - d - 1.0, -10.0, 10.0)
  raise ValueError(f"kl_penalty={kind!r}; choose one of {KL_PENALTIES}")


def score_at_last_token(scores, response_mask):
  """[B, N] token-level scores: each row's score at its last real completion token, 0 elsewhere."""
  m = jnp.asarray(response_mask, jnp.float32)
  last = jnp.maximum(jnp.sum(m, -1).astype(jnp.int32) - 1, 0)
  hit = (jnp.arange(m.shape[1])[None] == last[:, None]) & (jnp.sum(m, -1) > 0)[:, None]
  return jnp.where(hit, jnp.asarray(scores, jnp.float32)[:, None], 0.0)


def gae(rewards, values, response_mask, gamma: float, lam: float):
  """(advantages before whitening, returns) [B, N]: verl `compute_gae_advantage_return` (module docstring)."""
  r, v, m = (jnp.asarray(x, jnp.float32).T for x in (rewards, values, response_mask))

  def back(carry, xs):
    next_value, last = carry
    r_t, v_t, m_t = xs
    delta = r_t + gamma * next_value - v_t
    adv = delta + gamma * lam * last
    next_value = v_t * m_t + (1.0 - m_t) * next_value
    last = adv * m_t + (1.0 - m_t) * last
    return (next_value, last), last

  zero = jnp.zeros(r.shape[1], jnp.float32)
  _, adv = jax.lax.scan(back, (zero, zero), (r, v, m), reverse=True)
  adv = adv.T
  return adv, adv + jnp.asarray(values, jnp.float32)


def masked_whiten(x, mask):
  """verl `masked_whiten`: (x - mean) · rsqrt(var + 1e-8), mean and unbiased variance over mask."""
  m = jnp.asarray(mask, jnp.float32)
  n = jnp.sum(m)
  mean = jnp.sum(x * m) / n
  var = jnp.sum(jnp.square(x - mean) * m) / n * (n / (n - 1.0))
  return (x - mean) * jax.lax.rsqrt(var + 1e-8)


def value_loss(vpreds, values, returns, response_mask, cliprange_value: float, weights=None):
  """(loss, clip fraction): verl `compute_value_loss`, token-mean over response_mask (or the whole
  batch's `weights` for a micro-batch, `fineflax.rl.losses.aggregate`)."""
  clipped = jnp.clip(vpreds, values - cliprange_value, values + cliprange_value)
  l1, l2 = jnp.square(vpreds - returns), jnp.square(clipped - returns)
  loss = 0.5 * aggregate(jnp.maximum(l1, l2), response_mask, "token-mean", weights=weights)
  return loss, masked_mean((l2 > l1).astype(jnp.float32), response_mask)


@functools.partial(jax.jit, static_argnames=("gamma", "lam", "kl_coef", "kind"))
def _targets(scores, values, old_logp, ref_logp, mask, response_mask, *, gamma, lam, kl_coef, kind):
  rewards = score_at_last_token(scores, response_mask)
  kld = jnp.zeros_like(rewards)
  if ref_logp is not None:
    kld = kl_penalty(old_logp, ref_logp, kind) * mask
    rewards = rewards - kl_coef * kld
  adv, returns = gae(rewards, values * response_mask, response_mask, gamma, lam)
  row_kl = jnp.sum(kld * mask, -1) / jnp.sum(mask, -1).clip(1.0)  # verl's critic/kl: masked mean per row
  return masked_whiten(adv, response_mask), returns, jnp.mean(row_kl)


def ppo_targets(batch: dict, ppo) -> tuple[np.ndarray, np.ndarray, dict]:
  """(advantages, returns [B, N] NumPy, metrics) of a host batch holding rewards [B], values, old_logp
  (and ref_logp when ppo.kl_in_reward), mask and response_mask [B, N]: the module docstring's formulas."""
  ref = batch["ref_logp"] if ppo.kl_in_reward else None
  adv, ret, kl = _targets(batch["rewards"], batch["values"], batch["old_logp"], ref, batch["mask"],
                          batch["response_mask"], gamma=float(ppo.gamma), lam=float(ppo.lam),
                          kl_coef=float(ppo.kl_coef), kind=ppo.kl_penalty)
  metrics = {"critic_kl": float(kl), "critic_kl_coef": float(ppo.kl_coef if ppo.kl_in_reward else 0.0)}
  return np.asarray(adv), np.asarray(ret), metrics


def response_mask(batch: dict) -> np.ndarray:
  """float32 [B, N]: 1 on every real completion token (the completion columns of attention_mask)."""
  n = batch["completion"].shape[1]
  return np.asarray(batch["attention_mask"])[:, -n:].astype(np.float32)


# ----------------------------------------------------------------------------- the critic

def critic_values(params, base, batch, *, model_config, lora_scale=1.0, remat="none", dtype=jnp.float32):
  """V [B, N] (float32) at the positions predicting the completion tokens (every position of a packed
  micro-batch, `fineflax.rl.micro`): the critic's LoRA on `base` (params["lora"]) or its own whole model
  (params["model"], base unused)."""
  trainable, base = (params["model"], None) if "model" in params else (params["lora"], base)
  h = completion_hidden(trainable, base, batch, model_config=model_config, lora_scale=lora_scale,
                        remat=remat, dtype=dtype)
  head = params["head"]
  return jnp.einsum("bth,h->bt", h.astype(jnp.float32), head["kernel"][:, 0]) + head["bias"][0]


def critic_loss(params, base, batch, *, cliprange_value: float, value_loss_coef: float, fwd_kwargs: dict):
  """(value_loss_coef · value loss, metrics vf_loss, vf_clipfrac, vpred_mean) on a batch holding values
  (old), returns, response_mask (and value_weights in a micro-batch)."""
  v = critic_values(params, base, batch, **fwd_kwargs)
  loss, clipfrac = value_loss(v, batch["values"], batch["returns"], batch["response_mask"], cliprange_value,
                              weights=batch.get("value_weights"))
  metrics = {"vf_loss": loss, "vf_clipfrac": clipfrac,
             "vpred_mean": masked_mean(jax.lax.stop_gradient(v), batch["response_mask"])}
  return value_loss_coef * loss, metrics


def _critic_apply(critic, grads, *, optimizer, skip_nonfinite: bool = False):
  params, opt_state, m = apply_gradients(critic["params"], critic["opt_state"], grads, optimizer,
                                         skip_nonfinite=skip_nonfinite)
  return {"params": params, "opt_state": opt_state}, {"critic_grad_norm": m["grad_norm"]}


class Critic:
  """The value model of a PPO run: init, values, and one optimizer step accumulated over micro-batches.

  state: {"params": {"lora": LoRA pytree (ppo.critic "lora") or "model": a float32 copy of the initial
  model ("full", as verl's critic), "head": {"kernel": [H, 1], "bias": [1]}}, "opt_state"}, kept as the
  train state's "critic" entry (checkpointed with it). `base`: the frozen weights a LoRA critic reads
  (the policy's base, or in full training its frozen initial parameters), set by `init`. donate (full
  training, `fineflax.train.trainable.Trainable.donate`): `apply` donates the critic state it is given and
  a non-finite gradient leaves it unchanged.
  """

  def __init__(self, ppo, optimizer_cfg, *, fwd_kwargs: dict, donate: bool = False, moment_dtype: str = "float32"):
    self.kind, self.base = ppo.critic, None
    cfg = types.SimpleNamespace(**{k: optimizer_cfg[k] for k in optimizer_cfg.keys()})
    cfg.learning_rate, cfg.warmup_steps = ppo.critic_lr, ppo.critic_warmup_steps
    self.optimizer = make_optimizer(cfg, moment_dtype)
    fwd = {k: v for k, v in fwd_kwargs.items() if k in ("model_config", "lora_scale", "remat", "dtype")}
    self.values = jax.jit(functools.partial(critic_values, **fwd))
    self.micro = make_micro_grad(functools.partial(critic_loss, cliprange_value=ppo.cliprange_value,
                                                   value_loss_coef=ppo.value_loss_coef, fwd_kwargs=fwd),
                                 weight_key="response_mask")
    self.apply = jax.jit(functools.partial(_critic_apply, optimizer=self.optimizer, skip_nonfinite=donate),
                         donate_argnums=(0,) if donate else ())

  def init(self, base, model_config, lora_cfg, seed: int) -> dict:
    """A fresh critic on the dense or quantised `base`: LoRA as the policy's (another key), or a float32
    copy of a dense base ("full"); head N(0, 0.02) (HF's initializer_range), bias 0."""
    k_lora, k_head = jax.random.split(jax.random.PRNGKey(seed + 2))
    head = {"kernel": 0.02 * jax.random.normal(k_head, (model_config.hidden_size, 1), jnp.float32),
            "bias": jnp.zeros((1,), jnp.float32)}
    if self.kind == "full":
      # always a copy (jnp.array), never the base's arrays themselves: a donating `apply` deletes its input
      f32 = lambda x: jnp.array(x, jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.array(x)
      params = {"model": jax.tree.map(f32, base), "head": head}
    else:
      self.base = base
      params = {"lora": lora_lib.init_lora(base, model_config, lora_cfg, k_lora), "head": head}
    return {"params": params, "opt_state": self.optimizer.init(params)}
