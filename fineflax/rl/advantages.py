"""Group-relative advantages (GRPO, Dr. GRPO), DAPO dynamic-sampling filter and overlong shaping.

Rewards are laid out group after group: rewards[g * group_size + j] is completion j of prompt g
(`group_advantages` also takes one group id per reward, for groups of any size).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

SCALES = ("group", "batch", "none")


def _grouped(rewards, group_size: int) -> jnp.ndarray:
  r = jnp.asarray(rewards, jnp.float32)
  if r.ndim != 1:
    raise ValueError(f"rewards must be 1-D [N], got shape {r.shape}")
  if group_size < 1 or r.shape[0] % group_size:
    raise ValueError(f"{r.shape[0]} rewards do not split into groups of {group_size}")
  return r.reshape(-1, group_size)


def group_advantages(rewards, groups, scale: str = "group", eps: float = 1e-6) -> np.ndarray:
  """A_i = (R_i - mean(R_group)) / (std + eps), one per completion, float32 [N].

  groups: an int K, the group size of rewards laid out group after group (K >= 2, dividing N), or one
  group id per reward (groups of any size in any order, as the agent transitions of one task; a group of
  one reward gets A = 0).
  scale "group": std over the completion's group;  "batch": std over all N rewards (TRL
  scale_rewards="batch"; the mean stays per group);  "none": A_i = R_i - mean(R_group) (Dr. GRPO,
  LUFFY's released code).
  std is the sample standard deviation (ddof=1), as `torch.std` in both TRL and verl
  (`compute_grpo_outcome_advantage`); eps = 1e-6 as verl (TRL uses 1e-4). Computed in float64; a group
  of all-equal rewards gets exactly A = 0.
  """
  if scale not in SCALES:
    raise ValueError(f"unknown advantage scale {scale!r}; expected one of {SCALES}")
  r = np.asarray(rewards, np.float64)
  if r.ndim != 1:
    raise ValueError(f"rewards must be 1-D [N], got shape {r.shape}")
  if isinstance(groups, (int, np.integer)):
    if groups < 2:
      raise ValueError(f"group-relative advantages need group_size >= 2, got {groups}")
    if r.shape[0] % groups:
      raise ValueError(f"{r.shape[0]} rewards do not split into groups of {groups}")
    index = np.arange(r.shape[0]) // groups
  else:
    if len(groups) != r.shape[0]:
      raise ValueError(f"{len(groups)} group ids for {r.shape[0]} rewards")
    index = np.unique(np.asarray(groups), return_inverse=True)[1].reshape(-1)
  count = np.bincount(index)
  centred = r - (np.bincount(index, r) / count)[index]
  spread = np.bincount(index, centred * centred)
  high, low = np.full(len(count), -np.inf), np.full(len(count), np.inf)
  np.maximum.at(high, index, r)
  np.minimum.at(low, index, r)
  centred = np.where((high == low)[index], 0.0, centred)  # also every group of one
  if scale == "group":
    centred = centred / (np.sqrt(spread / np.maximum(count - 1, 1)) + eps)[index]
  elif scale == "batch":
    centred = centred / ((r.std(ddof=1) if r.shape[0] > 1 else 0.0) + eps)
  return centred.astype(np.float32)


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
