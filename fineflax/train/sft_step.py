"""Supervised fine-tuning of LoRA adapters: the loss and one jitted optimizer step.

A batch holds `grad_accum` micro-batches: arrays [A, B, T] with the fields of `fineflax.data`
(tokens, targets, loss_mask, attention_mask, positions, segment_ids). One step = one optimizer update on
the token-weighted mean over all A micro-batches, exactly as one batch of A*B rows would give.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fineflax.mesh import shard_batch
from fineflax.models import ModelConfig, forward_hidden, output_kernel
from fineflax.models.logprobs import chunked_token_logp, fused_weighted_nll
from fineflax.train.grad_accum import accumulate, make_micro_grad, step_state, update_unless
from fineflax.train.state import State
from fineflax.train.trainable import LOSS_HEADS, model_weights


def sft_nll(trainable, base, batch, *, model_config: ModelConfig, lora_scale: float, lora_dropout: float = 0.0,
            dropout_rng=None, remat: str = "none", dtype=jnp.float32, logits_chunk: int = 256,
            causal_prefix: bool = False, loss_head: str = "chunked"):
  """(sum_t -log p(target_t) * loss_mask_t, sum_t loss_mask_t) over one micro-batch [B, T].

  trainable / base: the LoRA on the frozen base, or (base None) the full parameters
  (`fineflax.train.trainable.model_weights`).

  causal_prefix=True: the batch holds one right-padded sequence a row (`fineflax.data` without packing),
  so its segment_ids are ignored and attention is plain causal (`forward_hidden`): same loss, faster kernel.
  loss_head (config.train.loss_head): "chunked" (`chunked_token_logp`: a trained head's backward recomputes
  each chunk's logits) or "fused" (`fused_weighted_nll`: the head's gradients made in the forward pass, the
  logits once); the same sum.
  """
  params, lora = model_weights(trainable, base)
  h = forward_hidden(params, model_config, batch["tokens"], positions=batch["positions"],
                     attention_mask=batch["attention_mask"],
                     segment_ids=None if causal_prefix else batch.get("segment_ids"),
                     lora=lora, lora_scale=lora_scale, lora_dropout=lora_dropout,
                     dropout_rng=dropout_rng, remat=remat, dtype=dtype, causal_prefix=causal_prefix)
  mask = batch["loss_mask"].astype(jnp.float32)
  with jax.named_scope("loss_head"):  # named for benchmarks/profile_step.py
    kernel = output_kernel(params, model_config, dtype, softcap_applied=True)
    if loss_head == "fused":
      return fused_weighted_nll(h, kernel, batch["targets"], mask, logits_chunk,
                                model_config.final_logit_softcapping), jnp.sum(mask)
    if loss_head != "chunked":
      raise ValueError(f"loss_head={loss_head!r}; choose one of {', '.join(LOSS_HEADS)}")
    logp = chunked_token_logp(h, kernel, batch["targets"], logits_chunk, model_config.final_logit_softcapping)
  return -jnp.sum(logp * mask), jnp.sum(mask)


def sft_share(lora, base, batch, **loss_kwargs):
  """(sum NLL of one micro-batch / the whole step's loss-token count `num_loss_tokens`, metrics): its share
  of the step's mean NLL (`fineflax.train.grad_accum`; `dropout_rng` in the batch when dropout is on)."""
  nll, _ = sft_nll(lora, base, batch, dropout_rng=batch.get("dropout_rng"), **loss_kwargs)
  return nll / batch["num_loss_tokens"], {}


def _num_tokens(batch) -> jnp.ndarray:
  return jnp.sum(batch["attention_mask"].astype(jnp.float32))


def sft_step(state: State, base, batch, *, optimizer: optax.GradientTransformation, skip_nonfinite: bool = False,
             **loss_kwargs):
  """One update: grads of mean NLL (over all A micro-batches' loss tokens) w.r.t. state["params"] only
  (the LoRA, or every parameter when base is None), summed over micro-batches in float32.
  skip_nonfinite (a donated state, `make_sft_fns`): a non-finite loss or gradient leaves params and
  moments unchanged."""
  rng, step_rng = jax.random.split(state["rng"])
  num_micro = batch["tokens"].shape[0]

  def micro(carry, xs):
    grad_acc, nll_acc, n_acc = carry
    mb, key = xs
    (nll, n), g = jax.value_and_grad(
        lambda lo: sft_nll(lo, base, mb, dropout_rng=key, **loss_kwargs), has_aux=True)(state["params"])
    return (jax.tree.map(jnp.add, grad_acc, g), nll_acc + nll, n_acc + n), None

  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), state["params"])
  keys = jax.random.split(step_rng, num_micro)
  (grads, nll, n), _ = jax.lax.scan(micro, (zeros, 0.0, 0.0), (batch, keys))
  n = jnp.maximum(n, 1.0)
  grads = jax.tree.map(lambda g: g / n, grads)
  metrics = {"loss": nll / n, "loss_tokens": n, "tokens": _num_tokens(batch),
             "grad_norm": optax.tree.norm(grads)}

  def update(params, opt_state):
    with jax.named_scope("optimizer"):  # named for benchmarks/profile_step.py
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state

  if skip_nonfinite:
    skip = ~(jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"]))
    params, opt_state = update_unless(skip, update, state["params"], state["opt_state"])
  else:
    params, opt_state = update(state["params"], state["opt_state"])
  return {"step": state["step"] + 1, "params": params, "opt_state": opt_state, "rng": rng}, metrics


def eval_step(lora, base, batch, **loss_kwargs):
  """(sum NLL, number of loss tokens) of one micro-batch [B, T], no dropout."""
  loss_kwargs = dict(loss_kwargs, lora_dropout=0.0, loss_head="chunked")  # no gradient: no fused head
  return sft_nll(lora, base, batch, **loss_kwargs)


def make_sft_micro_step(optimizer, donate: bool = False, **loss_kwargs):
  """step(state, base, micro_batches, mesh=None) -> (state, metrics): one update on the token-weighted
  mean NLL of host micro-batches of packed rows ([D, T] each, `fineflax.data.packing.repack`; split over
  the mesh's devices here), the gradient accumulated over them (`fineflax.train.grad_accum`: one compiled
  micro-step for any count). Metrics as `sft_step`'s. donate: as `make_sft_fns`."""
  micro = make_micro_grad(functools.partial(sft_share, **dict(loss_kwargs, causal_prefix=False)),
                          weight_key="loss_mask")
  apply = jax.jit(lambda state, grads, rng: step_state(state, grads, optimizer, skip_nonfinite=donate, rng=rng),
                  donate_argnums=(0,) if donate else ())

  def step(state, base, micro_batches, mesh=None):
    n = sum(float(mb["loss_mask"].sum()) for mb in micro_batches)
    tokens = sum(float(mb["attention_mask"].sum()) for mb in micro_batches)
    rng, step_rng = jax.random.split(state["rng"])
    keys = jax.random.split(step_rng, len(micro_batches))
    place = (lambda mb: shard_batch(mb, mesh)) if mesh is not None else (lambda mb: mb)
    mbs = [dict(place(mb), num_loss_tokens=np.float32(max(n, 1.0)), dropout_rng=keys[i])
           for i, mb in enumerate(micro_batches)]
    grads, m = accumulate(micro, state["params"], base, mbs)
    state, m2 = apply(state, grads, rng)
    return state, {"loss": m["loss"], "loss_tokens": n, "tokens": tokens, "grad_norm": m2["grad_norm"]}

  return step


def make_sft_fns(optimizer, donate: bool = False, **loss_kwargs):
  """(jitted train step, jitted eval step) closed over static settings.

  donate=False (LoRA): the state is kept (it is small, and the loop keeps the previous state when a step
  produces a non-finite loss). donate=True (full training, `fineflax.train.trainable.Trainable.donate`):
  the step donates the state (the new params and moments reuse the old buffers) and a non-finite step
  leaves them unchanged; the caller reads only the returned state.
  """
  train = jax.jit(functools.partial(sft_step, optimizer=optimizer, skip_nonfinite=donate, **loss_kwargs),
                  donate_argnums=(0,) if donate else ())
  evaluate = jax.jit(functools.partial(eval_step, **loss_kwargs))
  return train, evaluate


def stack_micro_batches(batches: list[dict], pad_id: int) -> dict[str, np.ndarray]:
  """[A, B, T] arrays from A micro-batches, right-padding each to the widest T (padding is inert)."""
  width = max(b["tokens"].shape[1] for b in batches)
  def pad(name, a):
    value = pad_id if name == "tokens" else 0
    return np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=value)
  return {k: np.stack([pad(k, b[k]) for b in batches]) for k in batches[0]}
