"""The engine's choice of decode attention over pages (`Engine(attention=...)`).

  "auto"          FINEFLAX_PAGED_ATTENTION when set; else "paged_decode" on a GPU backend when the kernel
                  applies (head_dim and page size powers of two), else "gather" (the CPU path)
  "gather"        `models.paged` gather path (the reference; prefill and T > 1 always use it)
  "pallas"        JAX's Pallas paged-attention kernel (one device only: it is not partitioned over kv heads)
  "paged_decode"  fineflax's kernel (`models.paged_decode`), also under tensor parallelism; its block
                  parameters come from FINEFLAX_PAGED_DECODE ("pages_per_block=4,splits=0,num_warps=4,
                  num_stages=3", any subset) or from a `DecodeKernel` passed as `attention`
"""
from __future__ import annotations

import dataclasses
import os

import jax

from fineflax.models.paged import PAGED_KERNELS, pallas_available
from fineflax.models.paged_decode import DecodeKernel, supports

BLOCK_FIELDS = ("pages_per_block", "splits", "num_warps", "num_stages")


def kernel_from_env(text: str | None) -> DecodeKernel:
  """A DecodeKernel from "name=int,..." (names of BLOCK_FIELDS); empty / None: the defaults."""
  values = {}
  for item in filter(None, (text or "").replace(" ", "").split(",")):
    name, _, value = item.partition("=")
    if name not in BLOCK_FIELDS or not value.lstrip("-").isdigit():
      raise ValueError(f"FINEFLAX_PAGED_DECODE item {item!r}: expected name=int with name in {BLOCK_FIELDS}")
    values[name] = int(value)
  return DecodeKernel(**values)


def resolve_attention(attention, config, page_size: int, mesh=None):
  """"gather" | "pallas" | a DecodeKernel (with `mesh`) for the engine's decode programs; ValueError naming
  the choice when it does not apply."""
  if isinstance(attention, DecodeKernel):
    kernel = attention
  else:
    if attention == "auto":
      default = ("paged_decode" if jax.default_backend() == "gpu" and supports(config.head_dim, page_size) is None
                 else "gather")
      attention = os.environ.get("FINEFLAX_PAGED_ATTENTION", default)
    if attention not in PAGED_KERNELS:
      raise ValueError(f"attention={attention!r}; choose one of {PAGED_KERNELS} or 'auto'")
    if attention == "pallas" and not pallas_available():
      raise ValueError("attention='pallas': this jax has no jax.experimental.pallas.ops.gpu.paged_attention")
    if attention == "pallas" and mesh is not None:
      raise ValueError("attention='pallas' with tensor parallelism (a mesh with a model axis): JAX's Pallas kernel "
                       "is not partitioned over kv heads; use attention='paged_decode' or 'gather'")
    if attention != "paged_decode":
      return attention
    kernel = kernel_from_env(os.environ.get("FINEFLAX_PAGED_DECODE"))
  reason = supports(config.head_dim, page_size)
  if reason:
    raise ValueError(f"attention='paged_decode': {reason}; use attention='gather'")
  return dataclasses.replace(kernel, mesh=mesh)
