"""The optimizer: AdamW with linear warmup + cosine decay and global-norm gradient clipping (optax)."""
from __future__ import annotations

import optax


def make_schedule(cfg) -> optax.Schedule:
  """lr(t): 0 -> cfg.learning_rate over cfg.warmup_steps, then cosine to cfg.end_lr_ratio * lr at cfg.num_steps."""
  warmup = min(cfg.warmup_steps, max(cfg.num_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=warmup,
      decay_steps=max(cfg.num_steps, warmup + 1), end_value=cfg.learning_rate * cfg.end_lr_ratio)


def make_optimizer(cfg) -> optax.GradientTransformation:
  """clip_by_global_norm(cfg.grad_clip) then adamw(schedule, b1, b2, weight_decay)."""
  parts = []
  if cfg.grad_clip and cfg.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(cfg.grad_clip))
  parts.append(optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=1e-8,
                           weight_decay=cfg.weight_decay))
  return optax.chain(*parts)
