"""Knowledge distillation into a LoRA: forward KL from a teacher's token distributions, one jitted step.

Per completion token t (p = softmax(z / tau) of the logits z of the position that predicts token t):

  full logits   KL_t = sum_v p_T(v) (log p_T(v) - log p_S(v))                     over the whole vocabulary
  top-k         KL_t = sum_{v in K} q_T(v) (log q_T(v) - log p_S(v)),  q_T(v) = p_T(v) / sum_{u in K} p_T(u)

Top-k convention: K = the teacher's k most likely tokens; the teacher is renormalised over K (q_T is 0
outside K) and the student keeps its full-vocabulary log-softmax, so KL_t = KL(q_T || p_S) >= 0 and equals
the full KL when K covers all the teacher's mass. Teacher log-probs given as top-k log-probs at
temperature 1 (an API's `top_logprobs`) give the same q_T: softmax(logp_K / tau) over K.
The loss is the token mean sum_t KL_t m_t / sum_t m_t over the completion mask m (no tau^2 factor; fold it
into the learning rate if wanted). A micro-batch (`make_distill_micro_step`, config.train.micro_batch_tokens)
holds `num_tokens` = sum_t m_t of the whole batch: its loss is its share sum_{t in mb} KL_t m_t / num_tokens,
and the batch's gradient is the sum of its micro-batches' (`fineflax.train.grad_accum`).

Batch (the RL layout of `fineflax.rl.step`: left-padded prompt of width P, completion of width N at the end):
  tokens, attention_mask, positions [B, S]       what the student reads
  mask [B, N]                                    1 = completion token that enters the loss
  teacher_tokens, teacher_attention_mask, teacher_positions [B, S_T]   optional: what the teacher reads
                                                 (another prompt, same N completion tokens at the end);
                                                 absent = the student's sequences
The teacher is `(params, model_config, lora, lora_scale)`: the student's base + another adapter, or a
separate model with the same vocabulary. It runs under stop_gradient; only the student's LoRA is updated.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fineflax.models import ModelConfig, forward_hidden, output_kernel
from fineflax.models.decoder import project_logits
from fineflax.train.grad_accum import accumulate, make_micro_grad, step_state
from fineflax.train.trainable import model_weights


class Teacher(NamedTuple):
  """A frozen teacher: params (maybe the student's base), its config, an optional LoRA and its scale."""
  params: Any
  config: ModelConfig
  lora: Any = None
  lora_scale: float = 1.0


def kl_full(teacher_logits, student_logits, tau: float = 1.0):
  """KL(softmax(z_T/tau) || softmax(z_S/tau)) per position: [..., V] x [..., V] -> [...]."""
  lt = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / tau, axis=-1)
  ls = jax.nn.log_softmax(student_logits.astype(jnp.float32) / tau, axis=-1)
  return jnp.sum(jnp.exp(lt) * (lt - ls), axis=-1)


def kl_topk(teacher_topk, teacher_ids, student_logits, tau: float = 1.0):
  """KL(q_T || softmax(z_S/tau)) per position, q_T = softmax(teacher_topk / tau) over the k given ids.

  teacher_topk [..., k]: the teacher's top-k logits or log-probs (any per-position constant cancels);
  teacher_ids [..., k] their token ids; student_logits [..., V].
  """
  lq = jax.nn.log_softmax(teacher_topk.astype(jnp.float32) / tau, axis=-1)
  ls = jax.nn.log_softmax(student_logits.astype(jnp.float32) / tau, axis=-1)
  ls_k = jnp.take_along_axis(ls, teacher_ids, axis=-1)
  return jnp.sum(jnp.exp(lq) * (lq - ls_k), axis=-1)


def chunked_kl(h_student, w_student, h_teacher, w_teacher, *, tau: float = 1.0, top_k: int = 0,
               chunk: int = 128):
  """Per-token KL [B, N] from hidden states [B, N, H] and output kernels [H, V], N-chunk by N-chunk.

  At most [B, chunk, V] logits of each model live at once (`lax.map` over a `jax.checkpoint`ed body, as
  `chunked_token_logp_and_entropy`). top_k > 0: the teacher's top-k only (`kl_topk`); 0: full (`kl_full`).
  """
  if w_student.shape[-1] != w_teacher.shape[-1]:
    raise ValueError(f"teacher vocabulary {w_teacher.shape[-1]} != student vocabulary {w_student.shape[-1]}")
  b, n, _ = h_student.shape
  chunk = max(1, min(int(chunk), n))
  m = -(-n // chunk)

  def split(h):
    h = jnp.pad(h, ((0, 0), (0, m * chunk - n), (0, 0)))
    return h.reshape(b, m, chunk, h.shape[-1]).swapaxes(0, 1)

  @jax.checkpoint
  def one_chunk(args):
    hs, ht = args
    zs = project_logits(hs, w_student.astype(hs.dtype))
    zt = jax.lax.stop_gradient(project_logits(ht, w_teacher.astype(ht.dtype)))
    if top_k:
      vals, ids = jax.lax.top_k(zt, top_k)
      return kl_topk(vals, ids, zs, tau)
    return kl_full(zt, zs, tau)

  kl = jax.lax.map(one_chunk, (split(h_student), split(h_teacher)))
  return kl.swapaxes(0, 1).reshape(b, m * chunk)[:, :n]


def completion_hidden(params, config, tokens, attention_mask, positions, n: int, *, lora=None,
                      lora_scale=1.0, remat="none", dtype=jnp.float32):
  """Hidden states [B, N, H] of the positions predicting the last N tokens (position t predicts t + 1)."""
  h = forward_hidden(params, config, tokens, positions=positions, attention_mask=attention_mask,
                     lora=lora, lora_scale=lora_scale, remat=remat, dtype=dtype)
  return jax.lax.dynamic_slice_in_dim(h, tokens.shape[1] - n - 1, n, axis=1)


def distill_loss(trainable, base, teacher: Teacher, batch, *, model_config: ModelConfig, lora_scale: float,
                 tau: float = 1.0, top_k: int = 0, remat: str = "none", dtype=jnp.float32,
                 logits_chunk: int = 128):
  """(token-mean forward KL over the completion mask, metrics) of the student: base + the LoRA
  `trainable`, or (base None) the full parameters `trainable` (`fineflax.train.trainable.model_weights`).
  With batch["num_tokens"] (a micro-batch) the sum is divided by it, the whole batch's mask count."""
  n = batch["mask"].shape[1]
  params, lora = model_weights(trainable, base)
  hs = completion_hidden(params, model_config, batch["tokens"], batch["attention_mask"], batch["positions"],
                         n, lora=lora, lora_scale=lora_scale, remat=remat, dtype=dtype)
  t_tokens = batch.get("teacher_tokens", batch["tokens"])
  t_attn = batch.get("teacher_attention_mask", batch["attention_mask"])
  t_pos = batch.get("teacher_positions", batch["positions"])
  ht = completion_hidden(teacher.params, teacher.config, t_tokens, t_attn, t_pos, n, lora=teacher.lora,
                         lora_scale=teacher.lora_scale, dtype=dtype)
  ht = jax.lax.stop_gradient(ht)
  kl = chunked_kl(hs, output_kernel(params, model_config, dtype), ht,
                  jax.lax.stop_gradient(output_kernel(teacher.params, teacher.config, dtype)),
                  tau=tau, top_k=top_k, chunk=logits_chunk)
  mask = batch["mask"].astype(jnp.float32)
  count = batch["num_tokens"] if "num_tokens" in batch else jnp.maximum(jnp.sum(mask), 1.0)
  loss = jnp.sum(kl * mask) / count  # token mean over the (whole batch's) completion tokens
  return loss, {"kl": loss, "kl_max": jnp.max(jnp.where(mask > 0, kl, 0.0)), "loss_tokens": jnp.sum(mask)}


def distill_step(state, base, teacher: Teacher, batch, *, optimizer: optax.GradientTransformation,
                 skip_nonfinite: bool = False, **loss_kwargs):
  """One optimizer update of the student's trainable params (state["params"]) on `distill_loss`; pure, jit-able.

  state = {"step", "params", "opt_state", "rng"} as `fineflax.train.state.init_state`. skip_nonfinite (a
  donated state, `make_distill_fn`): a non-finite loss or gradient leaves params and moments unchanged.
  """
  (loss, metrics), grads = jax.value_and_grad(distill_loss, has_aux=True)(
      state["params"], base, teacher, batch, **loss_kwargs)
  state, m = step_state(state, grads, optimizer, skip_nonfinite=skip_nonfinite, loss=loss)
  return state, dict(metrics, loss=loss, **m)


def make_distill_fn(optimizer, *, model_config: ModelConfig, teacher_config: Optional[ModelConfig] = None,
                    teacher_lora_scale: float = 1.0, donate: bool = False, **loss_kwargs):
  """jit(distill_step)(state, base, teacher_params, teacher_lora, batch) with the static settings bound;
  donate=True (full training, `fineflax.train.trainable.Trainable.donate`): the state is donated (the new
  params and moments reuse its buffers; only the returned state may be read) and a non-finite step
  leaves them unchanged."""
  teacher_config = teacher_config or model_config

  def step(state, base, teacher_params, teacher_lora, batch):
    teacher = Teacher(teacher_params, teacher_config, teacher_lora, teacher_lora_scale)
    return distill_step(state, base, teacher, batch, optimizer=optimizer, model_config=model_config,
                        skip_nonfinite=donate, **loss_kwargs)
  return jax.jit(step, donate_argnums=(0,) if donate else ())


def micro_rows(batch_rows: int, width: int, budget: int, devices: int = 1) -> int:
  """Rows of one micro-batch: `devices` x the padded rows of `width` tokens that fit a budget of
  `budget` tokens per device (config.train.micro_batch_tokens; at least one whole row)."""
  if budget < width:
    raise ValueError(f"config.train.micro_batch_tokens={budget}: a distillation row holds {width} tokens "
                     f"(prompt + completion, padded); the budget must be at least that (or 0: the whole batch)")
  return min(budget // width, -(-batch_rows // devices)) * devices


def make_distill_micro_step(optimizer, *, model_config: ModelConfig, teacher_config: Optional[ModelConfig] = None,
                            teacher_lora_scale: float = 1.0, donate: bool = False, **loss_kwargs):
  """step(state, base, teacher_params, teacher_lora, micro_batches) -> (state, metrics): one update on
  the token-mean KL of the whole batch, its gradient accumulated over micro-batches of its rows (each
  holding the whole batch's `num_tokens`; one compiled micro-step for any count,
  `fineflax.train.grad_accum`) -> the same update as `make_distill_fn` on the whole batch. Metrics as
  `distill_step`'s (kl_max: the largest micro-batch's). donate: as `make_distill_fn`."""
  teacher_config = teacher_config or model_config

  def share(trainable, frozen, mb):
    base, teacher_params, teacher_lora = frozen
    teacher = Teacher(teacher_params, teacher_config, teacher_lora, teacher_lora_scale)
    return distill_loss(trainable, base, teacher, mb, model_config=model_config, **loss_kwargs)

  micro = make_micro_grad(share, additive=("loss", "kl", "loss_tokens"), maximum=("kl_max",))
  apply = jax.jit(functools.partial(step_state, optimizer=optimizer, skip_nonfinite=donate),
                  donate_argnums=(0,) if donate else ())

  def step(state, base, teacher_params, teacher_lora, micro_batches):
    n = jnp.maximum(sum(jnp.sum(jnp.asarray(mb["mask"], jnp.float32)) for mb in micro_batches), 1.0)
    mbs = [dict(mb, num_tokens=n) for mb in micro_batches]
    grads, m = accumulate(micro, state["params"], (base, teacher_params, teacher_lora), mbs)
    state, m2 = apply(state, grads, loss=m["loss"])
    return state, dict(m, **m2)

  return step
