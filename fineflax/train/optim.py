"""The optimizer: AdamW with linear warmup + cosine decay and global-norm gradient clipping (optax),
computed in float32 whatever the parameters' dtype (`with_f32_state`), its moments stored in float32
(default) or bfloat16 (`config.train.moment_dtype`)."""
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


def _cast_floats(tree, dtype):
  """`tree` with its floating leaves cast to `dtype` (the integer step counters as they are)."""
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x, tree)


def _f32(tree):
  """`tree` with its floating leaves cast to float32 (the others as they are)."""
  return _cast_floats(tree, jnp.float32)


MOMENT_DTYPES = ("float32", "bfloat16")  # config.train.moment_dtype


def with_f32_state(tx: optax.GradientTransformation, moment_dtype="float32") -> optax.GradientTransformation:
  """`tx` computed in float32, its floating state (AdamW's mu and nu) stored in `moment_dtype`.

  init: tx.init of float32 views of the params, cast to `moment_dtype`. update: the stored state read as
  float32, mu' = b1·mu + (1 - b1)·g and nu' = b2·nu + (1 - b2)·g² (and the update) computed in float32 from
  float32 gradients and params, mu' and nu' rounded to `moment_dtype` (round to nearest) when stored; the
  update is float32. `optax.apply_updates` then adds it to each param and casts the sum to the param's
  dtype: bf16 parameters with f32 moments (config.train.master_dtype="bfloat16"); with float32 moments
  an identity for f32 parameters. bfloat16 moments halve the optimizer's bytes (torch's AdamW keeps its
  moments in the parameters' dtype: bf16 for a bf16 model)."""
  dtype = jnp.dtype(moment_dtype)
  if dtype == jnp.float32:
    return optax.GradientTransformation(
        lambda params: tx.init(_f32(params)),
        lambda updates, state, params=None: tx.update(_f32(updates), state,
                                                      None if params is None else _f32(params)))

  def update(updates, state, params=None):
    out, new = tx.update(_f32(updates), _f32(state), None if params is None else _f32(params))
    return out, _cast_floats(new, dtype)

  return optax.GradientTransformation(lambda params: _cast_floats(tx.init(_f32(params)), dtype), update)


def make_optimizer(cfg, moment_dtype="float32") -> optax.GradientTransformation:
  """clip_by_global_norm(cfg.grad_clip) then adamw(schedule, b1, b2, weight_decay), computed in float32,
  the moments stored in `moment_dtype` (`with_f32_state`; the jobs pass `trainable.moment_dtype(config)`)."""
  if str(moment_dtype) not in MOMENT_DTYPES:
    raise ValueError(f"moment_dtype={moment_dtype!r}; choose one of {', '.join(MOMENT_DTYPES)}")
  parts = []
  if cfg.grad_clip and cfg.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(cfg.grad_clip))
  parts.append(optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=1e-8,
                           weight_decay=cfg.weight_decay))
  return with_f32_state(optax.chain(*parts), moment_dtype)
