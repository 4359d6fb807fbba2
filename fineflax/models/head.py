"""The decoder's output head: the [H, V] projection (the embedding transposed when tied), the f32 logits
h @ W with a backward that never copies a bf16 head to f32, and Gemma 2's final-logit soft-capping.
Split from `fineflax.models.decoder` (which re-exports these names)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fineflax.models.attention import softcap
from fineflax.models.config import ModelConfig
from fineflax.quant.matmul import materialize

Params = Any


def final_logit_softcap(logits: jnp.ndarray, config: ModelConfig) -> jnp.ndarray:
  """The model's final logits from the raw h @ output_kernel ones (soft-capped for Gemma 2). Every
  consumer of raw projected logits (chunked log-probs included) must apply this."""
  return softcap(logits, config.final_logit_softcapping)


def output_kernel(params: Params, config: ModelConfig, dtype, softcap_applied: bool = False) -> jnp.ndarray:
  """The [H, V] output projection (embedding transposed when tied).

  For a model with final-logit soft-capping (Gemma 2) h @ kernel is not the model's logits: callers must
  apply `final_logit_softcap` and say so with `softcap_applied=True`, else this raises (so no chunked
  log-prob path silently drops the cap).
  """
  if config.final_logit_softcapping is not None and not softcap_applied:
    raise ValueError(f"{config.model_type}: final_logit_softcapping={config.final_logit_softcapping}: raw "
                     "h @ output_kernel are not the logits; apply final_logit_softcap(logits, config) and "
                     "pass output_kernel(..., softcap_applied=True)")
  if config.tie_word_embeddings:
    return params["embed"].astype(dtype).T
  return materialize(params["lm_head"]["kernel"], dtype)


@jax.custom_vjp
def project_logits(h: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
  """f32 logits h @ w [..., V] for h [..., H], w [H, V] (f32 accumulation).

  The backward pass casts the f32 logit gradient to w's dtype before both matmuls, so a bf16 output
  matrix is never copied to f32 (2.2 GB for a 152k x 3584 head): dh = g @ w.T, dw = h.T @ g.
  """
  return jnp.matmul(h, w, preferred_element_type=jnp.float32)


def _project_fwd(h, w):
  return project_logits(h, w), (h, w)


def _project_bwd(res, g):
  h, w = res
  g = g.astype(w.dtype)
  dh = jnp.matmul(g, w.T, preferred_element_type=jnp.float32).astype(h.dtype)
  dw = jnp.einsum("...h,...v->hv", h, g, preferred_element_type=jnp.float32).astype(w.dtype)
  return dh, dw


project_logits.defvjp(_project_fwd, _project_bwd)


def logits_from_hidden(params: Params, config: ModelConfig, h: jnp.ndarray) -> jnp.ndarray:
  """f32 logits [..., V] = final_logit_softcap(h @ output_kernel) (f32 accumulation)."""
  w = output_kernel(params, config, h.dtype, softcap_applied=True)
  return final_logit_softcap(project_logits(h, w), config)
