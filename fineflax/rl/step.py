"""The jitted RL update: per-token log-probs of completions under base+LoRA, then a GRPO-family loss.

Batch (NumPy/jax arrays; B sequences, S = P + N tokens: left-padded prompt of width P, completion N):
  tokens [B, S], attention_mask [B, S], positions [B, S]   the full sequences as the model reads them
  completion [B, N]       completion tokens (model-generated, inserted tool text, or an off-policy trace)
  mask [B, N]             1 = a token the policy produced and that enters the loss (not tool text/padding)
  old_logp [B, N]         log-probs under the policy that sampled the batch (recomputed before updating;
                          absent with on_policy=True: the loss's own logp under stop_gradient)
  ref_logp [B, N]         log-probs under the base with LoRA off (only read when beta > 0)
  advantages [B]          group-normalised advantages
  is_off_policy [B]       LUFFY trace / ExGRPO replayed row (uses the shaping loss); optional
  behaviour_logp [B, N]   recorded log-probs of off-policy/replayed rows; optional
A packed micro-batch (`fineflax.rl.micro`) holds rows of several sequences instead ([R, T], with
segment_ids): every per-token field is laid out at the position whose hidden state predicts the token.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fineflax.models import forward_hidden, output_kernel
from fineflax.models.logprobs import chunked_token_logp_and_entropy
from fineflax.rl.objectives import get_objective
from fineflax.train.grad_accum import step_state
from fineflax.train.trainable import model_weights


def completion_hidden(trainable, base, batch, *, model_config, lora_scale=1.0, remat="none", dtype=jnp.float32):
  """Final-norm hidden states [B, N, H] at the positions predicting the completion tokens (every position
  of a packed micro-batch, whose fields are laid out that way already); `trainable` / `base` as
  `fineflax.train.trainable.model_weights`."""
  n = batch["completion"].shape[1]
  s = batch["tokens"].shape[1]
  params, lora = model_weights(trainable, base)
  h = forward_hidden(params, model_config, batch["tokens"], positions=batch["positions"],
                     attention_mask=batch["attention_mask"], segment_ids=batch.get("segment_ids"), lora=lora,
                     lora_scale=lora_scale, remat=remat, dtype=dtype)
  return h if "segment_ids" in batch else jax.lax.dynamic_slice_in_dim(h, s - n - 1, n, axis=1)


def completion_logp(trainable, base, batch, *, model_config, lora_scale=1.0, remat="none", dtype=jnp.float32,
                    logits_chunk=256, temperature=1.0):
  """(logp [B, N], entropy [B, N]) of the completion tokens under softmax(logits / temperature).

  trainable / base: the LoRA on the frozen base (None: the base alone), or (base None) the full
  parameters (`fineflax.train.trainable.model_weights`).

  Hidden state t predicts token t + 1. `temperature` is the rollout temperature: the policy that the
  loss differentiates is the distribution the samples came from (as TRL and verl do); logits are
  h @ W, so h / T gives logits / T exactly.
  """
  params, _ = model_weights(trainable, base)
  h = completion_hidden(trainable, base, batch, model_config=model_config, lora_scale=lora_scale, remat=remat,
                        dtype=dtype)
  if temperature != 1.0:
    h = h / jnp.asarray(temperature, h.dtype)
  return chunked_token_logp_and_entropy(h, output_kernel(params, model_config, dtype, softcap_applied=True),
                                        batch["completion"], chunk=logits_chunk,
                                        logit_softcap=model_config.final_logit_softcapping)


def rl_loss(lora, base, batch, *, objective: str, loss_kwargs: dict, fwd_kwargs: dict, on_policy: bool = False):
  """(scalar loss, metrics) of `objective` (an entry of `fineflax.rl.objectives.OBJECTIVES`).

  on_policy=True: these params sampled the batch and none of its optimizer steps has run yet (one step
  per rollout batch: `fineflax.rl.update.reuses_current_logp`), so old_logp = stop_gradient(logp): the
  ratio is 1 and its gradient A·grad(logp), the same as with a recomputed old_logp (TRL's
  `per_token_logps.detach()`), without the extra forward. The batch must then hold no old_logp."""
  logp, entropy = completion_logp(lora, base, batch, **fwd_kwargs)
  if on_policy:
    if "old_logp" in batch:
      raise ValueError("rl_loss(on_policy=True) takes its old_logp from the current logp; the batch holds one")
    batch = dict(batch, old_logp=jax.lax.stop_gradient(logp))
  return get_objective(objective).loss(logp, entropy, batch, **loss_kwargs)


def rl_step(state, base, batch, *, optimizer, objective, loss_kwargs, fwd_kwargs, skip_grad_bound=0.0,
            on_policy: bool = False, skip_nonfinite: bool = False):
  """One optimizer update of state["params"] (LoRA, or the whole model when `base` is None) on `rl_loss`;
  a frozen base gets no gradient (`apply_gradients`: a step over `skip_grad_bound`, or with
  skip_nonfinite a non-finite one, leaves the params and moments unchanged). on_policy: `rl_loss`'s."""
  (loss, metrics), grads = jax.value_and_grad(
      functools.partial(rl_loss, objective=objective, loss_kwargs=loss_kwargs, fwd_kwargs=fwd_kwargs,
                        on_policy=on_policy),
      has_aux=True)(state["params"], base, batch)
  state, m = step_state(state, grads, optimizer, skip_grad_bound, skip_nonfinite, loss=loss)
  return state, dict(metrics, **m)


def make_rl_fns(optimizer, *, objective: str, loss_kwargs: dict, fwd_kwargs: dict, skip_grad_bound: float = 0.0,
                on_policy: bool = False, donate: bool = False):
  """(jitted rl_step, jitted completion_logp -> (logp, entropy) [B, N]); on_policy: the step's (`rl_loss`:
  its batches hold no old_logp).

  donate=True (full training, `fineflax.train.trainable.Trainable.donate`): the step donates its state, so XLA
  writes the new params and moments into the old buffers (one copy at the peak instead of two); the
  caller must read only the returned state. A non-finite step then leaves params and moments unchanged
  (skip_nonfinite), since the loop cannot keep the donated previous state. LoRA mode keeps the state.
  """
  get_objective(objective)
  step = jax.jit(functools.partial(rl_step, optimizer=optimizer, objective=objective,
                                   loss_kwargs=loss_kwargs, fwd_kwargs=fwd_kwargs,
                                   skip_grad_bound=skip_grad_bound, on_policy=on_policy, skip_nonfinite=donate),
                 donate_argnums=(0,) if donate else ())
  logp = jax.jit(functools.partial(completion_logp, **fwd_kwargs))
  return step, logp
