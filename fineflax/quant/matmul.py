"""y = x @ dequantize(W) for a frozen quantised W whose dense copy is never a residual of autodiff.

  forward:   y = x @ W.dequantize(dtype)
  backward:  dx = dy @ W.dequantize(dtype)^T   (W dequantised again; no cotangent for the frozen W)

Plain `x @ w.dequantize(dtype)` under `jax.grad` keeps the dense [in, out] W alive from the forward pass
to the backward pass (it is the matmul's residual): one bf16 copy of every quantised linear without remat,
and every linear of a layer at once inside a rematerialised layer. Here the residual is the quantised W
itself, so a dense W lives only while its own matmul runs (optimisation barriers tie each dequantisation to
the matmul's input, so XLA cannot schedule all of a layer's ahead of time); the price is one more
dequantisation a linear per step (benchmarks/RESULTS.md, section qlora_notes). Values equal the plain
product's.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def _zero_cotangent(leaf):
  if jnp.issubdtype(leaf.dtype, jnp.inexact):
    return jnp.zeros_like(leaf)
  return np.zeros(leaf.shape, jax.dtypes.float0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def quantized_matmul(x: jnp.ndarray, w, dtype) -> jnp.ndarray:
  """x [..., in] @ w.dequantize(dtype) [in, out] -> [..., out]; w is any quantised tensor (fineflax.quant)."""
  return x @ w.dequantize(dtype)


def _forward(x, w, dtype):
  x, w = jax.lax.optimization_barrier((x, w))  # dequantise only once x exists: not hoisted to the layer start
  return x @ w.dequantize(dtype), (w, jnp.zeros((), x.dtype))


def _backward(dtype, residuals, dy):
  w, x_like = residuals
  dy, w = jax.lax.optimization_barrier((dy, w))  # dequantise when dy arrives, not ahead of the whole backward
  dx = (dy @ w.dequantize(dtype).T).astype(x_like.dtype)
  return dx, jax.tree_util.tree_map(_zero_cotangent, w)


quantized_matmul.defvjp(_forward, _backward)
