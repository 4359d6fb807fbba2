"""The compute dtype of jobs (`config.model.dtype`), the server (`--dtype`) and in-process eval variants.

"auto" (the default everywhere) is resolved here and nowhere else: bfloat16 on GPUs and TPUs, float32 on
CPU, where bfloat16 matmuls run without hardware support (serving SmolLM2-135M on 2 CPU cores, an
11-token answer took 78-98 s in bfloat16 and 4-15 s in float32). An explicit "float32" / "bfloat16" wins.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
DTYPE_CHOICES = ("auto", *DTYPES)
LOW_PRECISION_BACKENDS = ("gpu", "tpu")  # backends with native bfloat16 matmuls


def resolve_dtype_name(name: str, backend: str | None = None) -> str:
  """"float32" / "bfloat16" as given; "auto" -> "bfloat16" on `backend` (default `jax.default_backend()`)
  gpu or tpu, else "float32". Raises ValueError naming the choices for anything else."""
  if name not in DTYPE_CHOICES:
    raise ValueError(f"dtype {name!r}; choose one of {', '.join(DTYPE_CHOICES)}")
  if name != "auto":
    return name
  backend = backend or jax.default_backend()
  return "bfloat16" if backend in LOW_PRECISION_BACKENDS else "float32"


def resolve_dtype(name: str, backend: str | None = None):
  """The jnp dtype of `resolve_dtype_name(name, backend)`."""
  return DTYPES[resolve_dtype_name(name, backend)]
