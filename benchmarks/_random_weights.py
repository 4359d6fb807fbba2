"""Random decoder weights of a model's shape, built on the device one layer (or one row chunk) at a time.

For benchmarks that need 7B-shaped weights without a checkpoint (benchmarks/qlora.py, benchmarks/nf4_gemv.py).
"""
from __future__ import annotations

import functools


def random_params(mc, quant: str, key, dtype, mark=lambda stage: None):
  """Random N(0, 0.02) weights built on the device one layer (or one row chunk) at a time.

  quant "nf4": every linear kernel is built as `fineflax.models.load(..., quant="nf4")` builds it from a
  checkpoint (`fineflax.quant.quantize_layers`: one dense layer on the device at a time, quantised and
  written into the stacked NF4 buffers in place). `mark(stage)` is called after the layers and after the
  embeddings (memory bookkeeping).
  """
  import jax
  import jax.numpy as jnp

  from fineflax.lora import linear_shapes
  from fineflax.quant import quantize_layers

  def normal(k, shape):
    return (0.02 * jax.random.normal(k, shape, jnp.float32)).astype(dtype)

  @functools.partial(jax.jit, static_argnums=(1, 2))
  def stacked(k, n, shape):  # [n, *shape], one entry at a time
    return jax.lax.map(lambda kk: normal(kk, shape), jax.random.split(k, n))

  layer = jax.jit(lambda k, i, shape: normal(jax.random.fold_in(k, i), shape), static_argnums=2)

  def kernel(k, shape):
    if quant == "nf4":
      return quantize_layers(lambda i: layer(k, i, shape), L, "nf4", double_quant=True, blocksize=64)
    return stacked(k, L, shape)

  @functools.partial(jax.jit, static_argnums=(1,))
  def chunked(k, shape):  # [R, C] in 8 row chunks (1 when R is not divisible); reshaped inside the jit
    n = 8 if shape[0] % 8 == 0 else 1
    return jax.lax.map(lambda kk: normal(kk, (shape[0] // n, shape[1])), jax.random.split(k, n)).reshape(shape)

  c, L = mc, mc.num_layers
  keys = iter(jax.random.split(key, 16))
  layers = {n: {"kernel": kernel(next(keys), s)} for n, s in linear_shapes(c).items()}
  if c.attention_bias:
    for n in ("q", "k", "v"):
      layers[n]["bias"] = jnp.zeros((L, linear_shapes(c)[n][1]), dtype)
  layers["attn_norm"] = jnp.ones((L, c.hidden_size), dtype)
  layers["mlp_norm"] = jnp.ones((L, c.hidden_size), dtype)
  mark("layers")
  params = {"embed": chunked(next(keys), (c.vocab_size, c.hidden_size)), "layers": layers,
            "final_norm": jnp.ones((c.hidden_size,), dtype)}
  mark("embed")
  if not c.tie_word_embeddings:
    params["lm_head"] = {"kernel": chunked(next(keys), (c.hidden_size, c.vocab_size))}
  return params
