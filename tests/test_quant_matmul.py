"""quantized_matmul: same values and input gradients as x @ W.dequantize(), and no dense W among the residuals."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.models import ModelConfig, forward, init_params
from fineflax.models.decoder import matmul
from fineflax.quant import quantize_int8, quantize_nf4
from fineflax.models.quantize import quantize_params
from fineflax.quant.matmul import quantized_matmul

IN, OUT = 128, 96


@pytest.fixture(scope="module", params=["nf4", "int8"])
def weight(request):
  w = 0.05 * jax.random.normal(jax.random.PRNGKey(0), (IN, OUT), jnp.float32)
  return quantize_nf4(w) if request.param == "nf4" else quantize_int8(w)


def _loss(x, w, mm):
  return jnp.sum(jnp.tanh(mm(x, w, jnp.float32)) * jnp.arange(OUT, dtype=jnp.float32))


def test_values_and_input_gradient_match_the_plain_product(weight):
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 7, IN), jnp.float32)
  plain = lambda x_, w_, d: x_ @ w_.dequantize(d)
  np.testing.assert_array_equal(np.asarray(quantized_matmul(x, weight, jnp.float32)),
                                np.asarray(plain(x, weight, jnp.float32)))
  g = jax.grad(_loss)(x, weight, quantized_matmul)
  g_ref = jax.grad(_loss)(x, weight, plain)
  np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-6, atol=1e-6)


def test_input_gradient_keeps_the_input_dtype(weight):
  x = jnp.ones((3, IN), jnp.bfloat16)
  _, vjp = jax.vjp(lambda x_: quantized_matmul(x_, weight, jnp.float32), x)
  (dx,) = vjp(jnp.ones((3, OUT), jnp.float32))
  assert dx.dtype == jnp.bfloat16 and dx.shape == x.shape


def test_no_dense_weight_is_a_residual(weight):
  """The VJP closure holds the quantised W, not an [IN, OUT] float copy (the plain product does hold one)."""
  x = jax.random.normal(jax.random.PRNGKey(2), (5, IN), jnp.float32)

  def dense_residuals(mm):
    _, vjp = jax.vjp(lambda x_: jnp.tanh(mm(x_, weight, jnp.float32)), x)
    return [a.shape for a in jax.tree_util.tree_leaves(vjp)
            if a.shape == (IN, OUT) and jnp.issubdtype(a.dtype, jnp.floating)]

  assert dense_residuals(lambda x_, w_, d: x_ @ w_.dequantize(d)) == [(IN, OUT)]  # what this avoids
  assert dense_residuals(quantized_matmul) == []
  assert dense_residuals(matmul) == []  # the decoder's entry point routes quantised kernels here


def test_model_gradient_through_nf4_layers_matches_dequantised_params():
  """d loss / d embeddings of a 2-layer model on NF4 kernels == the same on their dequantised copies."""
  c = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16)
  params = quantize_params(init_params(c, jax.random.PRNGKey(3)))
  dense = jax.tree_util.tree_map(lambda a: a.dequantize(jnp.float32) if hasattr(a, "dequantize") else a,
                                 params, is_leaf=lambda a: hasattr(a, "dequantize"))
  tokens = jax.random.randint(jax.random.PRNGKey(4), (2, 9), 0, c.vocab_size)

  def loss(embed, p):
    return jnp.mean(forward(dict(p, embed=embed), c, tokens, remat="full") ** 2)

  g = jax.grad(loss)(params["embed"], params)
  g_ref = jax.grad(loss)(dense["embed"], dense)
  np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-5, atol=1e-7)
