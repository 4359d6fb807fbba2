"""Gradient accumulation over micro-batches, and the optimizer update that may skip a step.

  micro = make_micro_grad(loss_fn)                                   # one jitted micro-step
  grads, metrics = accumulate(micro, trainable, frozen, micro_batches)
  trainable, opt_state, m = apply_gradients(trainable, opt_state, grads, optimizer, skip_grad_bound)

loss_fn(trainable, frozen, mb) -> (scalar loss, metrics dict). Each micro-batch's loss must already be
its share of the whole batch's loss (normalised by the whole batch: `fineflax.rl.losses.token_weights`,
a token count of the whole batch), so that by linearity of the gradient
  grad(loss of the batch) = sum_k grad(loss_k)   exactly (up to float summation order).
The micro-step is one compiled program, run in a Python loop for any number of micro-batches of the same
shape; gradients are summed in float32. Metrics: the keys in `additive` (losses, normalised by the whole
batch) are summed, those in `maximum` (a largest value; a loss may leave them out) take their maximum; the others (masked means
over a micro-batch's tokens) are averaged with weights sum(mb[weight_key]), which gives the whole batch's
masked mean for masks over those tokens.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

ADDITIVE = ("loss", "pg_loss", "vf_loss")


def _micro_grad(acc, trainable, frozen, mb, *, loss_fn, weight_key: str, additive: tuple[str, ...],
                maximum: tuple[str, ...] = ()):
  """acc + (grads of loss_fn on mb, its metrics weighted as the module docstring says)."""
  (loss, metrics), g = jax.value_and_grad(loss_fn, has_aux=True)(trainable, frozen, mb)
  w = jnp.sum(jnp.asarray(mb[weight_key], jnp.float32))
  metrics = dict(metrics, loss=loss)
  new = {"grads": jax.tree.map(lambda x: x.astype(jnp.float32), g),
         "metrics": {k: v if k in additive or k in maximum else v * w for k, v in metrics.items()}, "weight": w}
  out = jax.tree.map(jnp.add, acc, new)
  out["metrics"].update({k: jnp.maximum(acc["metrics"][k], new["metrics"][k]) for k in maximum if k in metrics})
  return out


class MicroGrad:
  """The jitted micro-step `step(acc, trainable, frozen, mb) -> acc` (acc donated) of `loss_fn`."""

  def __init__(self, loss_fn, *, weight_key: str = "mask", additive: tuple[str, ...] = ADDITIVE,
               maximum: tuple[str, ...] = ()):
    self.loss_fn, self.additive, self.maximum = loss_fn, additive, maximum
    self._metric_shapes: dict = {}  # the metrics' shapes by the inputs' structure and shapes (`zeros`)
    self.step = jax.jit(functools.partial(_micro_grad, loss_fn=loss_fn, weight_key=weight_key,
                                          additive=additive, maximum=maximum), donate_argnums=0)

  def zeros(self, trainable, frozen, mb) -> dict:
    """The empty accumulator: float32 zeros like `trainable` (same placement), zero metrics."""
    def metrics(t, f, b):
      (loss, m), _ = jax.value_and_grad(self.loss_fn, has_aux=True)(t, f, b)
      return dict(m, loss=loss)
    leaves, tree = jax.tree.flatten((trainable, frozen, mb))
    key = (tree, tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves))
    if key not in self._metric_shapes:  # traced once per input shapes (a whole model's trace takes seconds)
      self._metric_shapes[key] = jax.eval_shape(metrics, trainable, frozen, mb)
    shapes = self._metric_shapes[key]
    return {"grads": jax.tree.map(lambda x: jnp.zeros_like(x, jnp.float32), trainable),
            "metrics": {k: jnp.full(v.shape, -jnp.inf if k in self.maximum else 0, v.dtype)
                        for k, v in shapes.items()},
            "weight": jnp.zeros((), jnp.float32)}


def make_micro_grad(loss_fn, *, weight_key: str = "mask", additive: tuple[str, ...] = ADDITIVE,
                    maximum: tuple[str, ...] = ()) -> MicroGrad:
  return MicroGrad(loss_fn, weight_key=weight_key, additive=additive, maximum=maximum)


def accumulate(micro: MicroGrad, trainable, frozen, micro_batches):
  """(sum of the micro-batches' gradients (float32, like `trainable`), metrics of the whole batch)."""
  micro_batches = list(micro_batches)
  if not micro_batches:
    raise ValueError("accumulate needs at least one micro-batch")
  acc = micro.zeros(trainable, frozen, micro_batches[0])
  for mb in micro_batches:
    acc = micro.step(acc, trainable, frozen, mb)
  w = jnp.maximum(acc["weight"], 1e-8)
  keep = (*micro.additive, *micro.maximum)
  return acc["grads"], {k: v if k in keep else v / w for k, v in acc["metrics"].items()}


def update_unless(skip, update, trainable, opt_state):
  """update(trainable, opt_state) -> (trainable, opt_state), or both unchanged when the scalar `skip` is
  true: a `lax.cond`, so a donated state is updated in place without a select that keeps the old and the
  new values alive together (XLA's memory_analysis: benchmarks/donation_memory.py)."""
  return jax.lax.cond(skip, lambda t, o: (t, o), update, trainable, opt_state)


def apply_gradients(trainable, opt_state, grads, optimizer: optax.GradientTransformation,
                    skip_grad_bound: float = 0.0, skip_nonfinite: bool = False, loss=None):
  """(trainable, opt_state, {"grad_norm"[, "skipped"]}) after one optimizer update on `grads`.

  grad_norm is the global norm before any clipping. skip_grad_bound > 0 (ExGRPO's `skip_grad_bound`,
  its mix_actor `_optimizer_step`): a step whose grad_norm exceeds the bound, or is not finite, applies
  no update: parameters and optimizer state (moments, step count, hence the schedule's position) stay as
  they were; `skipped` is 1.0 for it, else 0.0. skip_nonfinite (a step that donates its state, whose
  caller can no longer keep the previous one: `fineflax.train.loop`): a non-finite grad_norm (or `loss`,
  when given) applies no update either (no `skipped` metric without a bound).
  """
  grad_norm = optax.tree.norm(grads)

  def update(params, state):
    updates, state = optimizer.update(jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params), state, params)
    return optax.apply_updates(params, updates), state

  metrics = {"grad_norm": grad_norm}
  if not (skip_grad_bound or skip_nonfinite):
    return *update(trainable, opt_state), metrics
  skip = ~(grad_norm <= skip_grad_bound) if skip_grad_bound else ~jnp.isfinite(grad_norm)  # NaN: skipped
  if skip_nonfinite and loss is not None:
    skip = skip | ~jnp.isfinite(loss)
  if skip_grad_bound:
    metrics["skipped"] = skip.astype(jnp.float32)
  return *update_unless(skip, update, trainable, opt_state), metrics


def step_state(state, grads, optimizer: optax.GradientTransformation, skip_grad_bound: float = 0.0,
               skip_nonfinite: bool = False, loss=None, **fields):
  """(train state after one `apply_gradients` update of state["params"], step + 1 and `fields` replaced;
  its metrics): the state update every step function ends with (skip_nonfinite, loss: `apply_gradients`)."""
  params, opt_state, metrics = apply_gradients(state["params"], state["opt_state"], grads, optimizer,
                                               skip_grad_bound, skip_nonfinite, loss)
  return dict(state, step=state["step"] + 1, params=params, opt_state=opt_state, **fields), metrics
