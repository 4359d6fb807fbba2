"""Rollout-vs-learner importance correction and mismatch metrics, as pure functions of [B, T] arrays.

The rollout engine samples each token from a behaviour policy mu (its own kernels, batch shapes and, with
`rl.async_steps` >= 1, weights up to k updates old) and records log mu(y_t) at sampling time
(`behaviour_logp`); the learner computes log pi_old(y_t) on the same tokens (`old_logp`). With
  d_t = clamp(old_logp_t - behaviour_logp_t, -20, 20),   r_t = exp(d_t) = pi_old(y_t) / mu(y_t)
the policy-gradient term of each token is weighted by w_t (stop-gradient):

  level "token":     the ratio of each token, r_t
  level "sequence":  one ratio per row, R_b = exp(clamp(sum_t m_bt d_bt, -20, 20)), broadcast over its tokens
  mode "none":  w = 1 (no correction; the statistics below still describe r)
  mode "tis":   w = min(r, C)                       truncated IS (Yao et al. 2025, "Your efficient RL
                                                    framework secretly brings you off-policy RL training"; C = 2)
  mode "mis":   w = r * 1[1/C <= r <= C]            masked IS (slime; Liu et al. 2025, "When speed kills
                                                    stability"): a token / row whose ratio leaves [1/C, C]
                                                    drops out of the policy gradient (its normaliser stays)

Metrics (masked over the tokens of on-policy rows, `mask`):
  is_weight_mean / is_weight_max   of w (mode "none": of r, the weight an uncorrected loss takes as 1)
  is_truncated_frac                share of tokens whose ratio exceeds C (what TIS truncates)
  is_masked_frac                   share of tokens whose ratio leaves [1/C, C] (what MIS masks)
  mismatch_kl                      KL(mu || pi_old) by the k3 estimator on samples of mu:
                                   mean_t (r_t - 1 - d_t)  (>= 0; 0 iff the log-probs agree)
  mismatch_kl_k1                   mean_t (behaviour_logp_t - old_logp_t)  (the plain estimator)
  mismatch_max_abs_dlogp           max_t |old_logp_t - behaviour_logp_t|
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

MODES = ("none", "tis", "mis")
LEVELS = ("token", "sequence")
_CLAMP = 20.0  # as the surrogate's log-ratio (fineflax.rl.losses)


def resolve_mode(importance: str, async_steps: int) -> str:
  """`rl.importance` with "auto" resolved: tis when rollouts may be stale (async_steps >= 1), else none.
  Uncorrected one-step-stale rollouts fell outside the synchronous run's interval and one seed collapsed
  (experiments/async_rl); TIS at C = 2 kept it near the synchronous curve."""
  if importance == "auto":
    return "tis" if async_steps else "none"
  return importance


def _masked_mean(x, m):
  return jnp.sum(x * m) / jnp.maximum(jnp.sum(m), 1.0)


def log_ratio(old_logp, behaviour_logp, mask, level: str = "token"):
  """[B, T] log r: clamp(old - behaviour, -20, 20) per token, or (level "sequence") each row's clamped
  sum over its masked tokens broadcast over the row."""
  if level not in LEVELS:
    raise ValueError(f"importance level {level!r}: choose one of {LEVELS}")
  m = jnp.asarray(mask, jnp.float32)
  d = jnp.clip(jnp.asarray(old_logp, jnp.float32) - jnp.asarray(behaviour_logp, jnp.float32), -_CLAMP, _CLAMP)
  if level == "sequence":
    d = jnp.broadcast_to(jnp.clip(jnp.sum(d * m, -1, keepdims=True), -_CLAMP, _CLAMP), d.shape)
  return d


def importance_weights(old_logp, behaviour_logp, mask, mode: str = "tis", level: str = "token", cap: float = 2.0):
  """(w [B, T] under stop_gradient, metrics) of the module docstring's formulas; `mask` [B, T] selects the
  tokens the metrics average (on-policy tokens of the loss)."""
  if mode not in MODES:
    raise ValueError(f"importance mode {mode!r}: choose one of {MODES}")
  if not cap > 1.0:
    raise ValueError(f"importance cap C={cap}: must be > 1 (the kept interval is [1/C, C])")
  m = jnp.asarray(mask, jnp.float32)
  r = jnp.exp(jax.lax.stop_gradient(log_ratio(old_logp, behaviour_logp, mask, level)))
  inside = (r >= 1.0 / cap) & (r <= cap)
  if mode == "tis":
    w = jnp.minimum(r, cap)
  elif mode == "mis":
    w = jnp.where(inside, r, 0.0)
  else:
    w = r
  stats = {"is_weight_mean": _masked_mean(w, m), "is_weight_max": jnp.max(jnp.where(m > 0, w, 0.0)),
           "is_truncated_frac": _masked_mean((r > cap).astype(jnp.float32), m),
           "is_masked_frac": _masked_mean((~inside).astype(jnp.float32), m)}
  return (jnp.ones_like(r) if mode == "none" else w), stats


def mismatch_stats(old_logp, behaviour_logp, mask) -> dict:
  """mismatch_kl (k3), mismatch_kl_k1 and mismatch_max_abs_dlogp of the module docstring over `mask`."""
  m = jnp.asarray(mask, jnp.float32)
  d = jax.lax.stop_gradient(jnp.asarray(old_logp, jnp.float32) - jnp.asarray(behaviour_logp, jnp.float32))
  dc = jnp.clip(d, -_CLAMP, _CLAMP)
  return {"mismatch_kl": _masked_mean(jnp.exp(dc) - dc - 1.0, m), "mismatch_kl_k1": _masked_mean(-d, m),
          "mismatch_max_abs_dlogp": jnp.max(jnp.where(m > 0, jnp.abs(d), 0.0))}


def correction(pg_per_token, old_logp, behaviour_logp, mask, *, importance: str = "none",
               importance_level: str = "token", importance_cap: float = 2.0):
  """(pg_per_token * w, metrics): the weights and every metric above over `mask` (the on-policy tokens);
  without behaviour log-probs (None) the loss unchanged and no metrics."""
  if behaviour_logp is None:
    if importance != "none":
      raise ValueError(f"importance={importance!r} needs the batch's behaviour_logp (the rollout log-probs)")
    return pg_per_token, {}
  w, stats = importance_weights(old_logp, behaviour_logp, mask, importance, importance_level, importance_cap)
  stats.update(mismatch_stats(old_logp, behaviour_logp, mask))
  return (pg_per_token if importance == "none" else pg_per_token * w), stats


# metrics that take the largest value over micro-batches (`fineflax.train.grad_accum`), not their mean
MAXIMUM_METRICS = ("is_weight_max", "mismatch_max_abs_dlogp")
