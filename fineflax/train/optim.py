"""The optimizer: AdamW with linear warmup + cosine decay and global-norm gradient clipping (optax),
kept in float32 whatever the parameters' dtype (`with_f32_state`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def make_schedule(cfg) -> optax.Schedule:
  """lr(t): 0 -> cfg.learning_rate over cfg.warmup_steps, then cosine to cfg.end_lr_ratio * lr at cfg.num_steps."""
  warmup = min(cfg.warmup_steps, max(cfg.num_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=warmup,
      decay_steps=max(cfg.num_steps, warmup + 1), end_value=cfg.learning_rate * cfg.end_lr_ratio)


def _f32(tree):
  """`tree` with its floating leaves cast to float32 (the others as they are)."""
  return jax.tree.map(lambda x: x.astype(jnp.float32) if jnp.issubdtype(jnp.result_type(x), jnp.floating)
                      else x, tree)


def with_f32_state(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` computed in float32: its state (AdamW's moments) is initialised from float32 views of the
  params, and each update sees float32 gradients and params and returns float32 updates.
  `optax.apply_updates` then adds them to each param and casts the sum to the param's dtype: bf16
  parameters with f32 moments (config.train.master_dtype="bfloat16"); an identity for f32 parameters."""
  return optax.GradientTransformation(
      lambda params: tx.init(_f32(params)),
      lambda updates, state, params=None: tx.update(_f32(updates), state, None if params is None else _f32(params)))


def make_optimizer(cfg) -> optax.GradientTransformation:
  """clip_by_global_norm(cfg.grad_clip) then adamw(schedule, b1, b2, weight_decay), in float32."""
  parts = []
  if cfg.grad_clip and cfg.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(cfg.grad_clip))
  parts.append(optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=1e-8,
                           weight_decay=cfg.weight_decay))
  return with_f32_state(optax.chain(*parts))
