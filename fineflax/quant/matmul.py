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

With FINEFLAX_NF4_KERNEL=pallas, forward products of at most `nf4_gemv.MAX_ROWS` rows on a GPU (decoding)
run as one Pallas kernel that reads the NF4 codes directly (`fineflax.quant.nf4_gemv`; same values up to
the order of the f32 sums). Not the default: on an H200 it was 0.96-1.12x XLA's unfused product (both
bound by decoding the codes, not by memory; benchmarks/RESULTS.md, section nf4_gemv).
"""
from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np


def _zero_cotangent(leaf):
  if jnp.issubdtype(leaf.dtype, jnp.inexact):
    return jnp.zeros_like(leaf)
  return np.zeros(leaf.shape, jax.dtypes.float0)


def _product(x, w, dtype):
  """x @ w.dequantize(dtype), through the fused NF4 kernel where it applies (see the module docstring)."""
  from fineflax.quant import nf4_gemv
  rows = math.prod(x.shape[:-1])
  if (os.environ.get("FINEFLAX_NF4_KERNEL", "xla") == "pallas" and jax.default_backend() == "gpu"
      and x.dtype == jnp.dtype(dtype) == jnp.bfloat16 and nf4_gemv.supported(rows, w)):
    y = nf4_gemv.nf4_matmul(x.reshape(rows, x.shape[-1]), w)
    return y.reshape(*x.shape[:-1], y.shape[-1])
  return x @ w.dequantize(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def quantized_matmul(x: jnp.ndarray, w, dtype) -> jnp.ndarray:
  """x [..., in] @ w.dequantize(dtype) [in, out] -> [..., out]; w is any quantised tensor (fineflax.quant)."""
  return _product(x, w, dtype)


def _forward(x, w, dtype):
  x, w = jax.lax.optimization_barrier((x, w))  # dequantise only once x exists: not hoisted to the layer start
  return _product(x, w, dtype), (w, jnp.zeros((), x.dtype))


def _backward(dtype, residuals, dy):
  w, x_like = residuals
  dy, w = jax.lax.optimization_barrier((dy, w))  # dequantise when dy arrives, not ahead of the whole backward
  dx = (dy @ w.dequantize(dtype).T).astype(x_like.dtype)
  return dx, jax.tree_util.tree_map(_zero_cotangent, w)


quantized_matmul.defvjp(_forward, _backward)
