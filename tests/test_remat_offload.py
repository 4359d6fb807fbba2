"""`model.remat = "offload"`: remat full whose per-layer inputs live in pinned host memory.

The gradients equal remat full's (the offload is a copy), and the mechanism is visible in the traced
gradient: the only residual the layer loop hands to the backward pass is the stack of layer inputs, typed
as host memory ([L, B, T, H] under the scan; L arrays [B, T, H] unrolled), where remat full keeps it on the
device. Whether XLA then places it in host memory is a GPU matter (benchmarks/qlora.py measures it).
"""
import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax import lora as L
from fineflax.models import ModelConfig, init_params
from fineflax.models.decoder import forward_hidden

C = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                num_kv_heads=1, head_dim=8)
B, T = 2, 6


def _setup():
  params = init_params(C, jax.random.PRNGKey(0))
  lora = L.init_lora(params, C, L.LoraConfig(r=2, alpha=4.0), jax.random.PRNGKey(1))
  lora = jax.tree.map(lambda x: x + 0.05, lora)  # b = 0 at init: make the adapters matter
  tokens = jax.random.randint(jax.random.PRNGKey(2), (B, T), 0, C.vocab_size)
  return params, lora, tokens


def _loss(lora, params, tokens, config, remat):
  h = forward_hidden(params, config, tokens, lora=lora, lora_scale=2.0, remat=remat)
  return jnp.sum(jnp.sin(h))


def _host_vars(jaxpr) -> list:
  """Shapes of every variable typed as host memory, in this jaxpr and the ones nested in it."""
  out = []
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      if getattr(v.aval, "memory_space", None) == jax.memory.Space.Host:
        out.append(tuple(v.aval.shape))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      out += _host_vars(sub)
  return out


def test_offload_gradients_equal_remat_full_and_the_residual_stack_is_host_typed():
  """Under the scan: equal gradients, and the stacked residual is host-typed under offload only."""
  params, lora, tokens = _setup()
  grads = {}
  for remat in ("full", "offload"):
    grad = jax.grad(_loss)
    grads[remat] = jax.jit(grad, static_argnums=(3, 4))(lora, params, tokens, C, remat)
    host = _host_vars(jax.make_jaxpr(grad, static_argnums=(3, 4))(lora, params, tokens, C, remat).jaxpr)
    if remat == "full":
      assert host == [], host
    else:  # the scan's stacked residual (and its slice read back per layer)
      assert (C.num_layers, B, T, C.hidden_size) in host, host
  for a, b in zip(jax.tree.leaves(grads["full"]), jax.tree.leaves(grads["offload"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    assert np.abs(np.asarray(a)).max() > 0


def test_unrolled_offload_puts_every_layer_input_in_host_memory():
  params, lora, tokens = _setup()
  config = dataclasses.replace(C, layer_loop="unrolled")
  host = _host_vars(jax.make_jaxpr(jax.grad(_loss), static_argnums=(3, 4))(lora, params, tokens, config,
                                                                        "offload").jaxpr)
  assert host.count((B, T, C.hidden_size)) >= C.num_layers, host


def test_unknown_remat_policy_is_a_clear_error():
  params, lora, tokens = _setup()
  with pytest.raises(ValueError, match=r"remat='host'; choose one of \['attn', 'dots', 'full', 'matmuls', 'none', 'offload'\] or save:NAME"):
    _loss(lora, params, tokens, C, "host")
