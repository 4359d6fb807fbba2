"""Group-relative advantages (GRPO, Dr. GRPO), DAPO dynamic-sampling filter and overlong shaping.

Rewards are laid out group after group: rewards[g * group_size + j] is completion j of prompt g.
"""
from __future__ import annotations

import jax.numpy as jnp

SCALES = ("group", "batch", "none")


def _grouped(rewards, group_size: int) -> jnp.ndarray:
  r = jnp.asarray(rewards, jnp.float32)
  if r.ndim != 1:
    raise ValueError(f"rewards must be 1-D [N], got shape {r.shape}")
  if group_size < 1 or r.shape[0] % group_size:
    raise ValueError(f"{r.shape[0]} rewards do not split into groups of {group_size}")
  return r.reshape(-1, group_size)


def group_advantages(rewards, group_size: int, scale: str = "group", eps: float = 1e-6) -> jnp.ndarray:
  """A_i = (R_i - mean(R_group)) / (std + eps), one per completion [N].

  scale "group": std over the completion's group;  "batch": std over all N rewards (TRL
  scale_rewards="batch"; the mean stays per group);  "none": A_i = R_i - mean(R_group) (Dr. GRPO,
  LUFFY's released code).
  std is the sample standard deviation (ddof=1), as `torch.std` in both TRL and verl
  (`compute_grpo_outcome_advantage`); eps = 1e-6 as verl (TRL uses 1e-4). A group of all-equal rewards
  gets exactly A = 0 (its f32 mean need not equal the rewards bit for bit, so the centred values are
  zeroed where max == min). Needs group_size >= 2 (a std of one sample is undefined).
  """
  if scale not in SCALES:
    raise ValueError(f"unknown advantage scale {scale!r}; expected one of {SCALES}")
  if group_size < 2:
    raise ValueError(f"group-relative advantages need group_size >= 2, got {group_size}")
  g = _grouped(rewards, group_size)
  centred = g - jnp.mean(g, axis=1, keepdims=True)
  equal = jnp.max(g, axis=1, keepdims=True) == jnp.min(g, axis=1, keepdims=True)
  centred = jnp.where(equal, 0.0, centred)
  if scale == "group":
    centred = centred / (jnp.std(g, axis=1, ddof=1, keepdims=True) + eps)
  elif scale == "batch":
    centred = centred / (jnp.std(g, ddof=1) + eps)
  return centred.reshape(-1)


def zero_variance_groups(rewards, group_size: int) -> jnp.ndarray:
  """bool [num_groups]: True where every reward in the group is equal (all-correct or all-wrong).

  DAPO dynamic sampling drops these groups (their advantages are all 0) and samples more prompts.
  """
  g = _grouped(rewards, group_size)
  return jnp.max(g, axis=1) == jnp.min(g, axis=1)


def dapo_overlong_penalty(lengths, max_len: int, buffer: int) -> jnp.ndarray:
  """DAPO soft overlong punishment (Yu et al. 2025, Eq. 13), added to the task reward.

  With L = |y|, L_max = max_len, L_cache = buffer:
    0                                  if L <= L_max - L_cache
    ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max
    -1                                 if L > L_max
  """
  if not 0 < buffer <= max_len:
    raise ValueError(f"need 0 < buffer <= max_len, got buffer={buffer}, max_len={max_len}")
  length = jnp.asarray(lengths, jnp.float32)
  start = float(max_len - buffer)
  ramp = (start - length) / float(buffer)
  return jnp.where(length <= start, 0.0, jnp.where(length <= max_len, ramp, -1.0))
