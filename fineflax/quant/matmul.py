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

Forward products on an unstacked NF4 [K, N] kernel may run as one Pallas kernel that reads the codes
directly (`fineflax.quant.nf4_gemv`; the same values up to the order of the f32 sums), chosen by
FINEFLAX_NF4_KERNEL:
  auto (default)  the kernel on a GPU backend where the measured table (`nf4_kernel_table`) has a winner
                  for (K, N, M bucket); XLA otherwise (always on CPU / TPU). With several devices only for a
                  `ShardedNF4` (tensor parallelism: each device's shard under shard_map, the table looked
                  up by the shard's shape); GSPMD would gather other split kernels in front of the call
  pallas          the kernel wherever its shape rules hold (interpreted off GPU: slow, for tests)
  xla             never the kernel
An `NF4KMajor` W (the K-major copy the unrolled decoder makes, `decode_layout`) runs its own kernel
(`fineflax.quant.nf4_kmajor_gemv`) for 1 to 64 rows under the same modes (auto: one GPU device, or a
shard), else XLA's dequantise + dot. The backward pass always dequantises (dx = dy @ W^T). The choice is made
while a product is traced: JAX keeps a traced function by its argument shapes, so a program traced before
FINEFLAX_NF4_KERNEL changed keeps its choice; compare choices in separate processes (the benchmarks do).
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


KERNEL_MODES = ("auto", "pallas", "xla")


def kernel_mode() -> str:
  """FINEFLAX_NF4_KERNEL (default auto); ValueError naming a value outside KERNEL_MODES."""
  mode = os.environ.get("FINEFLAX_NF4_KERNEL", "auto")
  if mode not in KERNEL_MODES:
    raise ValueError(f"FINEFLAX_NF4_KERNEL={mode!r}; expected one of {KERNEL_MODES}")
  return mode


LAYOUTS = ("auto", "kmajor", "bnb")


def _kernel_mode(x_dtype, dtype, sharded: bool = False) -> str | None:
  """FINEFLAX_NF4_KERNEL where a fused kernel may run for x of x_dtype and W dequantised to dtype: "pallas",
  "auto" (a GPU backend with one device, or one device's shard under shard_map: GSPMD would gather split
  leaves in front of a custom call), else None (XLA)."""
  mode = kernel_mode()
  floats = (jnp.bfloat16, jnp.float32)
  if mode == "xla" or jnp.dtype(x_dtype) not in floats or jnp.dtype(dtype) not in floats:
    return None
  if mode == "auto" and (jax.default_backend() != "gpu" or (jax.device_count() != 1 and not sharded)):
    return None
  return mode


def decode_layout(tensor_parallel: bool = False) -> str:
  """FINEFLAX_NF4_LAYOUT (default auto): the layout the unrolled decoder keeps its NF4 kernels in.
  "kmajor": a K-major copy (`NF4KMajor`, 4.5 bits a weight, made at sampler setup) for its faster kernel;
  "bnb": the NF4Tensors as they are (no copy); "auto": kmajor where that kernel runs (FINEFLAX_NF4_KERNEL
  pallas, or auto on a one-device GPU backend), else bnb; under tensor parallelism (`engine.tensor_parallel`
  lays the kernels out) auto is bnb: the K-major shards are not measured on GPUs yet. ValueError naming a
  value outside LAYOUTS."""
  layout = os.environ.get("FINEFLAX_NF4_LAYOUT", "auto")
  if layout not in LAYOUTS:
    raise ValueError(f"FINEFLAX_NF4_LAYOUT={layout!r}; expected one of {LAYOUTS}")
  if layout != "auto" or tensor_parallel:
    return "bnb" if layout == "auto" else layout
  return "kmajor" if _kernel_mode(jnp.float32, jnp.float32) else "bnb"


def _kmajor_config(rows: int, w, x_dtype, dtype, sharded: bool = False):
  """The `nf4_kmajor_gemv.KMajorConfig` for x [rows, K] @ an NF4KMajor w (its layer view, or one device's shard
  of a `ShardedNF4`: sharded), or None (XLA)."""
  from fineflax.quant import nf4_kmajor_gemv as km
  from fineflax.quant.nf4_kernel_table import kmajor_choice
  mode = _kernel_mode(x_dtype, dtype, sharded)
  if mode is None:
    return None
  cfg = kmajor_choice(*w.shape, rows) if mode == "auto" else km.default_config(rows, *w.shape)
  return cfg if cfg is not None and km.unsupported_reason((rows, w.shape[0]), w, cfg) is None else None


def kernel_config(rows: int, w, x_dtype, dtype, sharded: bool = False):
  """The `nf4_gemv.KernelConfig` the forward product x [rows, K] @ w uses, or None for XLA (docstring).
  sharded: w is one device's shard of a `ShardedNF4` (run under shard_map)."""
  from fineflax.quant import nf4_gemv, nf4_kernel_table
  mode = _kernel_mode(x_dtype, dtype, sharded)
  if mode is None or not isinstance(w, (nf4_gemv.NF4Tensor, nf4_gemv.NF4Layer)) or len(w.shape) != 2:
    return None
  if mode == "auto":
    cfg = nf4_kernel_table.kernel_choice(w.shape[0], w.shape[1], rows)
  else:
    cfg = nf4_gemv.default_config(rows)
  if cfg is None or nf4_gemv.unsupported_reason((rows, w.shape[0]), w, cfg) is not None:
    return None
  return cfg


def _product(x, w, dtype):
  """x @ w.dequantize(dtype), through a fused NF4 kernel where `kernel_config` / `_kmajor_config` picks one."""
  from fineflax.quant import nf4_gemv, nf4_kmajor_gemv
  from fineflax.quant.nf4_kmajor import NF4KMajor
  from fineflax.quant.sharded import ShardedNF4
  rows = math.prod(x.shape[:-1])
  interpret = jax.default_backend() != "gpu"
  sharded = isinstance(w, ShardedNF4)
  local = w.local() if sharded else w
  if isinstance(w.w if sharded else getattr(w, "stacked", w), NF4KMajor):
    cfg = _kmajor_config(rows, local, x.dtype, dtype, sharded) if rows and local is not None else None
    run = lambda x2, w2: nf4_kmajor_gemv.kmajor_matmul(x2, w2, dtype, cfg, interpret=interpret)
  else:
    cfg = kernel_config(rows, local, x.dtype, dtype, sharded) if rows and local is not None else None
    run = lambda x2, w2: nf4_gemv.nf4_matmul(x2, w2, dtype, cfg, interpret=interpret)
  if cfg is None:
    return x @ w.dequantize(dtype)
  x2 = x.reshape(rows, x.shape[-1])
  y = w.product(x2, run) if sharded else run(x2, w)
  return y.reshape(*x.shape[:-1], y.shape[-1])


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


def materialize(w, dtype) -> jnp.ndarray:
  """A weight as a dense array of `dtype`: dequantises quantised tensors, casts arrays."""
  return w.dequantize(dtype) if hasattr(w, "dequantize") else w.astype(dtype)
