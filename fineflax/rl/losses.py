"""RL policy losses as pure functions of per-token arrays (GRPO, DAPO, Dr. GRPO, LUFFY, ExGRPO).

Shapes: `logp`, `old_logp`, `ref_logp`, `mask` are [B, T] (B completions, T completion tokens; mask 1 =
a token of the model's own completion that counts). `advantages` is [B] (broadcast over T) or [B, T].
Every `*_surrogate` / `*_loss` of a token returns the per-token loss (to be minimised, before masking);
`aggregate` turns a [B, T] loss into a scalar. Conventions follow verl `core_algos.py` and LUFFY's
released `mix_core_alg.py` (cited per function).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fineflax.rl.importance import correction


AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "sum")
_LOG_RATIO_CLAMP = 20.0  # verl clamps logp - old_logp to [-20, 20] before exp


def _per_token(advantages: jnp.ndarray, like: jnp.ndarray) -> jnp.ndarray:
  """advantages [B] -> [B, 1] (broadcasts over T); [B, T] unchanged."""
  a = jnp.asarray(advantages, jnp.float32)
  if a.ndim == 1:
    return a[:, None]
  if a.shape != like.shape:
    raise ValueError(f"advantages shape {a.shape} is neither [B]={like.shape[:1]} nor [B, T]={like.shape}")
  return a


def masked_mean(x: jnp.ndarray, mask: jnp.ndarray, count=None) -> jnp.ndarray:
  """sum(x * m) / max(sum(m), 1): a masked mean that is 0, not NaN, for an empty mask. `count` replaces
  sum(m) (the token count of the whole batch when x, m are one micro-batch of it)."""
  m = jnp.asarray(mask, jnp.float32)
  return jnp.sum(x * m) / jnp.maximum(jnp.sum(m) if count is None else count, 1.0)


def clipped_surrogate(logp, old_logp, advantages, mask, epsilon_low: float = 0.2,
                      epsilon_high: float = 0.2, dual_clip: Optional[float] = None):
  """PPO/GRPO clipped surrogate (DAPO clip-higher through epsilon_high; dual clip as verl).

  r = exp(clamp(logp - old_logp, -20, 20))
  loss = max(-r·A, -clip(r, 1 - eps_low, 1 + eps_high)·A)            (= -min(r·A, clip(r)·A))
  dual clip c > 1 (Ye et al. 2019), tokens with A < 0 only: loss = min(loss, -c·A)
  Returns (per_token_loss [B, T], stats) with masked means: `clip_frac` (share of tokens where the
  clipped term is the larger loss), `dual_clip_frac`, `ratio_mean`, `approx_kl` = mean(old_logp - logp).
  """
  a = _per_token(advantages, logp)
  log_ratio = jnp.clip(logp - old_logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
  ratio = jnp.exp(log_ratio)
  loss_unclipped = -a * ratio
  loss_clipped = -a * jnp.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
  loss = jnp.maximum(loss_unclipped, loss_clipped)
  dual_clip_frac = jnp.zeros((), jnp.float32)
  if dual_clip is not None:
    if dual_clip <= 1.0:
      raise ValueError(f"dual_clip must be > 1 (verl clip_ratio_c), got {dual_clip}")
    loss_dual = -a * dual_clip
    dual_clip_frac = masked_mean(((loss > loss_dual) & (a < 0)).astype(jnp.float32), mask)
    loss = jnp.where(a < 0, jnp.minimum(loss, loss_dual), loss)
  stats = {"clip_frac": masked_mean((loss_clipped > loss_unclipped).astype(jnp.float32), mask),
           "dual_clip_frac": dual_clip_frac,
           "ratio_mean": masked_mean(ratio, mask),
           "approx_kl": masked_mean(-log_ratio, mask)}
  return loss, stats


def unclipped_surrogate(logp, old_logp, advantages, mask):
  """Plain importance-weighted policy gradient (LUFFY released code, `loss_remove_clip=True`).

  loss = -r·A, r = exp(clamp(logp - old_logp, -20, 20)). Returns (per_token_loss, stats) like
  `clipped_surrogate` (clip fractions are 0).
  """
  a = _per_token(advantages, logp)
  log_ratio = jnp.clip(logp - old_logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
  ratio = jnp.exp(log_ratio)
  zero = jnp.zeros((), jnp.float32)
  stats = {"clip_frac": zero, "dual_clip_frac": zero, "ratio_mean": masked_mean(ratio, mask),
           "approx_kl": masked_mean(-log_ratio, mask)}
  return -a * ratio, stats


def kl_k3(logp, ref_logp):
  """Schulman's k3 estimator of KL(pi_theta || pi_ref), per token (GRPO paper, TRL; no clamp).

  kl = exp(ref_logp - logp) - (ref_logp - logp) - 1   (>= 0, = 0 iff logp == ref_logp)
  """
  d = ref_logp - logp
  return jnp.exp(d) - d - 1.0


def policy_shaping_loss(logp, advantages, gamma: float = 0.1, behaviour_logp=None, shape: bool = True):
  """LUFFY off-policy loss with policy shaping, no clipping.

  x = pi_theta(y_t) = exp(logp)                          (behaviour probability taken as 1)
    or x = exp(logp - behaviour_logp)                    (recorded behaviour log-probs given)
  loss = -A · f(x),  f(x) = x / (x + gamma)   when shape, else  loss = -A · x.
  d loss / d logp = -A · gamma · x / (x + gamma)^2.
  LUFFY's released code (`compute_token_on_off_policy_loss`) shapes only when no target probs are
  given; with target probs it uses the plain ratio p / (p_b + 1e-6). `luffy_loss` reproduces that
  rule; ExGRPO shapes the ratio to a recorded behaviour policy (pass shape=True).
  """
  a = _per_token(advantages, logp)
  x = jnp.exp(logp if behaviour_logp is None else logp - behaviour_logp)
  return -a * (x / (x + gamma) if shape else x)


def exgrpo_replay_weight(logp, recorded_logp, beta: float = 0.1):
  """ExGRPO shaped importance weight of a replayed trajectory (Zhan et al. 2025, Sec. 3.2).

  w = exp(logp - recorded_logp),  f(w) = w / (w + beta),  beta = 0.1.
  """
  w = jnp.exp(logp - recorded_logp)
  return w / (w + beta)


# ----------------------------------------------------------------------------- aggregation

def aggregate(per_token_loss, mask, mode: str, max_len: Optional[int] = None, num_rows=None, weights=None):
  """Scalar loss from [B, T] per-token losses (verl `agg_loss`; L = per_token_loss, m = mask).

  "token-mean"              sum_bt L·m / sum_bt m                          (DAPO)
  "seq-mean-token-mean"     1/B sum_b (sum_t L·m / sum_t m)                (GRPO paper)
  "seq-mean-token-sum"      1/B sum_b sum_t L·m
  "seq-mean-token-sum-norm" 1/B sum_b sum_t L·m / max_len                  (Dr. GRPO; verl >= 0.5)
  "sum"                     sum_bt L·m / max_len                           (LUFFY released code,
                            `loss_remove_token_mean`; verl < 0.5's seq-mean-token-sum-norm)
  max_len defaults to T. Empty rows / an empty batch give 0, not NaN (verl: 1e-8 guard).
  num_rows (default B) is the B of the seq-mean modes: a batch padded with all-masked rows to split
  evenly over devices passes its real row count, so the padding changes nothing.
  weights [B, T] (`token_weights` of the whole (mini-)batch, laid out like L): the loss is sum_bt L·m·w,
  every mode being a weighted token sum; a micro-batch holding part of the tokens then gives its share of
  the whole batch's loss, and the shares add up to it (`mode` is already in the weights).
  """
  m = jnp.asarray(mask, jnp.float32)
  lm = per_token_loss * m
  if weights is not None:
    return jnp.sum(lm * weights)
  b, t = m.shape
  norm = float(t if max_len is None else max_len)
  row_mean = jnp.mean if num_rows is None else (lambda x: jnp.sum(x) / num_rows)
  if mode == "token-mean":
    return jnp.sum(lm) / jnp.maximum(jnp.sum(m), 1.0)
  if mode == "seq-mean-token-mean":
    return row_mean(jnp.sum(lm, -1) / jnp.maximum(jnp.sum(m, -1), 1.0))
  if mode == "seq-mean-token-sum":
    return row_mean(jnp.sum(lm, -1))
  if mode == "seq-mean-token-sum-norm":
    return row_mean(jnp.sum(lm, -1) / norm)
  if mode == "sum":
    return jnp.sum(lm) / norm
  raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")


def token_weights(mask, mode: str, max_len: Optional[int] = None, num_rows=None) -> np.ndarray:
  """float32 [B, T] weights w with aggregate(L, mask, mode, max_len, num_rows) == sum_bt L·m·w (NumPy,
  on the host, from the mask of the whole (mini-)batch before it is cut into micro-batches).

  token-mean 1 / max(sum m, 1);  seq-mean-token-mean 1 / (B · max(sum_t m_b, 1));
  seq-mean-token-sum 1 / B;  seq-mean-token-sum-norm 1 / (B · max_len);  sum 1 / max_len
  (B = num_rows, default the rows of mask; max_len default T).
  """
  m = np.asarray(mask, np.float32)
  b, t = m.shape
  rows = float(b if num_rows is None else num_rows)
  norm = float(t if max_len is None else max_len)
  if mode == "token-mean":
    w = np.full_like(m, 1.0 / max(float(m.sum()), 1.0))
  elif mode == "seq-mean-token-mean":
    w = np.broadcast_to(1.0 / (rows * np.maximum(m.sum(-1, keepdims=True), 1.0)), m.shape)
  elif mode == "seq-mean-token-sum":
    w = np.full_like(m, 1.0 / rows)
  elif mode == "seq-mean-token-sum-norm":
    w = np.full_like(m, 1.0 / (rows * norm))
  elif mode == "sum":
    w = np.full_like(m, 1.0 / norm)
  else:
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")
  return np.ascontiguousarray(w, np.float32)


# ----------------------------------------------------------------------------- full objectives

def _finish(pg_per_token, pg_stats, logp, ref_logp, mask, beta, entropy_coef, entropy, agg_mode, max_len,
            num_rows=None, weights=None, num_tokens=None):
  """loss = aggregate(pg + beta·kl_k3, agg_mode) - entropy_coef · token-mean(H).

  The entropy bonus is always a masked token mean, whatever `agg_mode` (LUFFY's released code:
  `entropy_loss = masked_mean(entropy, response_mask)`); metrics are masked token means.
  A micro-batch of a larger batch passes that batch's normalisers: `weights` (`token_weights`, for the
  aggregation) and `num_tokens` (its mask's token count, for the entropy mean), so the micro-batches'
  losses add up to the whole batch's.
  """
  per_token = pg_per_token
  metrics = dict(pg_stats)
  metrics["pg_loss"] = aggregate(pg_per_token, mask, agg_mode, max_len, num_rows, weights)
  if beta:
    if ref_logp is None:
      raise ValueError(f"beta={beta} needs ref_logp")
    kl = kl_k3(logp, ref_logp)
    per_token = per_token + beta * kl
    metrics["kl"] = masked_mean(kl, mask)
  loss = aggregate(per_token, mask, agg_mode, max_len, num_rows, weights)
  if entropy_coef:
    if entropy is None:
      raise ValueError(f"entropy_coef={entropy_coef} needs the per-token entropy")
    loss = loss - entropy_coef * masked_mean(entropy, mask, num_tokens)
  if entropy is not None:
    metrics["entropy"] = masked_mean(jax.lax.stop_gradient(entropy), mask)
  metrics["loss"] = loss
  return loss, metrics


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, *, epsilon_low: float = 0.2,
              epsilon_high: float = 0.2, dual_clip: Optional[float] = None, beta: float = 0.0,
              entropy_coef: float = 0.0, entropy=None, agg_mode: str = "seq-mean-token-mean",
              max_len: Optional[int] = None, clip: bool = True, num_rows=None, weights=None, num_tokens=None,
              behaviour_logp=None, importance: str = "none", importance_level: str = "token",
              importance_cap: float = 2.0):
  """GRPO / DAPO / Dr. GRPO objective -> (scalar loss, metrics).

  per token: l = -min(r·A, clip(r, 1-eps_low, 1+eps_high)·A) [dual clip]   (or -r·A when clip=False)
             · w  (the rollout importance weight: TIS / MIS / 1, `fineflax.rl.importance`)
             + beta · kl_k3(logp, ref_logp)
  loss = aggregate(l, mask, agg_mode, max_len) - entropy_coef · masked_mean(H, mask). The KL enters per token before aggregation (GRPO
  paper, TRL); `entropy` [B, T] is the current policy's entropy (e.g. `entropy_from_logits`).
  `behaviour_logp` [B, T]: the rollout engine's log-probs of the tokens (metrics of the mismatch and the
  weights w of `importance` "tis" / "mis"; None: w = 1, no such metrics).
  """
  if clip:
    pg, stats = clipped_surrogate(logp, old_logp, advantages, mask, epsilon_low, epsilon_high, dual_clip)
  else:
    pg, stats = unclipped_surrogate(logp, old_logp, advantages, mask)
  pg, is_stats = correction(pg, old_logp, behaviour_logp, mask, importance=importance,
                            importance_level=importance_level, importance_cap=importance_cap)
  stats = {**stats, **is_stats}
  return _finish(pg, stats, logp, ref_logp, mask, beta, entropy_coef, entropy, agg_mode, max_len, num_rows,
                 weights, num_tokens)


def luffy_loss(logp, old_logp, advantages, mask, is_off_policy, *, gamma: float = 0.1,
               off_policy_behaviour_logp=None, shape_off_policy: Optional[bool] = None,
               on_policy_clip: bool = True, epsilon_low: float = 0.2, epsilon_high: float = 0.2,
               dual_clip: Optional[float] = None, ref_logp=None, beta: float = 0.0,
               entropy_coef: float = 0.0, entropy=None, agg_mode: str = "seq-mean-token-mean",
               max_len: Optional[int] = None, num_rows=None, weights=None, num_tokens=None,
               behaviour_logp=None, importance: str = "none", importance_level: str = "token",
               importance_cap: float = 2.0):
  """LUFFY mixed-policy objective (Yan et al. 2025) -> (scalar loss, metrics).

  rows with is_off_policy [B] False: on-policy surrogate (clipped, or -r·A when on_policy_clip=False
    as in LUFFY's released code);
  rows with is_off_policy True:      policy_shaping_loss(logp, A, gamma, off_policy_behaviour_logp,
    shape) with shape = shape_off_policy, default (None): shape iff no behaviour log-probs are given
    (LUFFY's released code).
  Both kinds are aggregated together by `agg_mode`, with the same KL / entropy terms as `grpo_loss`;
  with no off-policy rows the result equals `grpo_loss(..., clip=on_policy_clip)` exactly.
  Advantages are computed over the mixed group by the caller (`group_advantages`).
  `behaviour_logp` / `importance*`: the rollout importance weights of `grpo_loss`, on the on-policy rows only
  (their metrics too); the off-policy rows keep their own terms.
  """
  if on_policy_clip:
    on, stats = clipped_surrogate(logp, old_logp, advantages, mask, epsilon_low, epsilon_high, dual_clip)
  else:
    on, stats = unclipped_surrogate(logp, old_logp, advantages, mask)
  shape = (off_policy_behaviour_logp is None) if shape_off_policy is None else shape_off_policy
  off = policy_shaping_loss(logp, advantages, gamma, off_policy_behaviour_logp, shape)
  is_off = jnp.asarray(is_off_policy, bool)
  is_off = is_off[:, None] if is_off.ndim == 1 else is_off  # [B] per row, or [B, T] per token (packed rows)
  m = jnp.asarray(mask, jnp.float32)
  on, is_stats = correction(on, old_logp, behaviour_logp, m * (1.0 - is_off), importance=importance,
                            importance_level=importance_level, importance_cap=importance_cap)
  pg = jnp.where(is_off, off, on)
  off_mask = m * is_off
  stats = dict(stats, **is_stats)
  stats["off_policy_prob"] = masked_mean(jnp.exp(jax.lax.stop_gradient(logp)), off_mask)
  stats["off_pg_loss"] = masked_mean(off, off_mask)
  stats["on_pg_loss"] = masked_mean(on, m * (1.0 - is_off))
  return _finish(pg, stats, logp, ref_logp, mask, beta, entropy_coef, entropy, agg_mode, max_len, num_rows,
                 weights, num_tokens)


def exgrpo_loss(logp, old_logp, recorded_logp, advantages, mask, is_replayed, *, replay_beta: float = 0.1,
                **kwargs):
  """ExGRPO mixed objective (Zhan et al. 2025) -> (scalar loss, metrics).

  fresh rows:    clipped surrogate with r = exp(logp - old_logp) (GRPO);
  replayed rows: l = -A · f(w), w = exp(logp - recorded_logp), f(w) = w / (w + replay_beta) -- the
                 shaped importance weight (`exgrpo_replay_weight`) replaces the clipped term, no clip.
  `recorded_logp` [B, T] holds the log-probs stored at rollout time (on fresh rows the rollout engine's:
  read only as `behaviour_logp` by the importance correction of `luffy_loss`). Both kinds
  are aggregated together; the replayed trajectory is one member of its group of K, its advantage
  computed with the K-1 fresh ones. Other keywords as `luffy_loss` (epsilons, beta, entropy, agg_mode).
  """
  return luffy_loss(logp, old_logp, advantages, mask, is_replayed, gamma=replay_beta,
                    off_policy_behaviour_logp=recorded_logp, shape_off_policy=True,
                    **{"behaviour_logp": recorded_logp, **kwargs})
