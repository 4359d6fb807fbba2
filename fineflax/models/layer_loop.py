"""How the decoder runs its stacked layers: `lax.scan` or an unrolled Python loop (`config.model.layer_loop`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

LAYER_LOOPS = ("scan", "unrolled")
LAYER_LOOP_CHOICES = ("auto", *LAYER_LOOPS)  # config.model.layer_loop; "auto" is resolved by resolve_layer_loop


def resolve_layer_loop(loop: str, remat: str, backend: str | None = None) -> str:
  """The training layer loop for `config.model.layer_loop`: "scan" / "unrolled" as given; "auto" ->
  "unrolled" on GPUs when remat == "none", else "scan".

  Measured (benchmarks/RESULTS.md, sft_unroll and qlora_unroll, 1B LoRA step, 4 x 1024, H200): with remat
  none the unrolled loop is 1.26x the scan's tokens/s (MFU 35.9% -> 45.0%) at 22% less peak memory; with
  remat full it is 1.02-1.04x at 40-55% MORE peak memory, so the scan stays. On CPU it only compiles slower.
  backend: default `jax.default_backend()`.
  """
  if loop not in LAYER_LOOP_CHOICES:
    raise ValueError(f"model.layer_loop={loop!r}; choose one of {LAYER_LOOP_CHOICES}")
  if loop != "auto":
    return loop
  backend = backend or jax.default_backend()
  return "unrolled" if backend == "gpu" and remat == "none" else "scan"


def run_layers(layer, carry, xs, num_layers: int, loop: str = "scan"):
  """carry after `layer(carry, xs_i)` for i = 0 .. L-1, xs_i = slice i of every leaf of `xs` ([L, ...]).

  loop="scan": `jax.lax.scan` (one compiled layer body; the backward pass keeps each layer's residuals
  in [L, ...] stacks written by dynamic-update-slice and copies weight slices out of the stacked leaves).
  loop="unrolled": a Python loop over static slices (`jnp.split` along L, whose transpose is a
  concatenate), so the program holds L copies of the body and every residual is its own buffer.
  Same `layer` function (with its remat policy) either way, so the same arithmetic.
  """
  if loop == "scan":
    return jax.lax.scan(layer, carry, xs)[0]
  if loop != "unrolled":
    raise ValueError(f"layer_loop={loop!r}; choose one of {LAYER_LOOPS}")
  leaves, treedef = jax.tree.flatten(xs)
  parts = [[p.squeeze(0) for p in jnp.split(a, num_layers, axis=0)] for a in leaves]
  for i in range(num_layers):
    carry, _ = layer(carry, treedef.unflatten([p[i] for p in parts]))
  return carry
