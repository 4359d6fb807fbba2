"""LoRA adapters as a pytree over the decoder's stacked linears, and the operations on them.

lora = {name: {"a": f32 [L, in, r], "b": f32 [L, r, out]}}; the decoder computes
y = x @ W + dropout(x) @ a @ b * scale for every name present (see `fineflax.models.decoder`).
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from fineflax.lora.config import LoraConfig, lora_scale
from fineflax.models.targets import resolve_targets
from fineflax.models.config import ModelConfig
from fineflax.models.decoder import LINEAR_NAMES
from fineflax.quant import NF4Tensor, full_shape, is_quantized, quantize_tensor


def linear_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
  """(in, out) of each linear of one layer."""
  return config.linear_shapes()


def _expected_kernel(config: ModelConfig, name: str) -> tuple[int, int, int]:
  return (config.num_layers, *linear_shapes(config)[name])


def init_lora(params: dict, config: ModelConfig, cfg: LoraConfig, rng: jax.Array) -> dict:
  """Fresh adapters for every target of `cfg` (f32): a ~ U(-1/sqrt(in), 1/sqrt(in)), b = 0.

  The bound is peft's `kaiming_uniform_(A.weight, a=sqrt(5))`: sqrt(6 / ((1 + 5) * fan_in)), fan_in = in.
  Raises a ValueError when a target is unknown or a kernel's shape disagrees with `config`.
  """
  layers = params["layers"]
  names = resolve_targets(cfg.target_modules, [n for n in LINEAR_NAMES if n in layers])
  lora = {}
  for name, key in zip(names, jax.random.split(rng, len(names))):
    shape = full_shape(layers[name]["kernel"])
    expected = _expected_kernel(config, name)
    if shape != expected:
      raise ValueError(f"params['layers'][{name!r}]['kernel'] has shape {shape}; the model config expects "
                       f"(L, in, out) = {expected}")
    L, n_in, n_out = shape
    bound = 1.0 / math.sqrt(n_in)
    lora[name] = {"a": jax.random.uniform(key, (L, n_in, cfg.r), jnp.float32, -bound, bound),
                  "b": jnp.zeros((L, cfg.r, n_out), jnp.float32)}
  return lora


def check_lora(lora: dict, config: ModelConfig, cfg: LoraConfig | None = None,
               source: str = "lora") -> None:
  """Raises a ValueError naming the leaf when `lora` does not fit `config` (and `cfg.r` when given)."""
  if not isinstance(lora, dict) or not lora:
    raise ValueError(f"{source}: expected a non-empty dict {{name: {{'a', 'b'}}}}, got {type(lora).__name__}")
  for name, ab in lora.items():
    if name not in LINEAR_NAMES:
      raise ValueError(f"{source}: unknown linear {name!r}; available: {list(LINEAR_NAMES)}")
    if not isinstance(ab, dict) or set(ab) != {"a", "b"}:
      got = sorted(ab) if isinstance(ab, dict) else type(ab).__name__
      raise ValueError(f"{source}[{name!r}]: expected keys {{'a', 'b'}}, got {got}")
    L, n_in, n_out = _expected_kernel(config, name)
    a, b = tuple(ab["a"].shape), tuple(ab["b"].shape)
    r = a[-1] if len(a) == 3 else None
    if cfg is not None and r != cfg.r:
      raise ValueError(f"{source}[{name!r}]['a'] has shape {a}; expected (L, in, r) = {(L, n_in, cfg.r)}")
    if a != (L, n_in, r):
      raise ValueError(f"{source}[{name!r}]['a'] has shape {a}; expected (L, in, r) = {(L, n_in, 'r')}")
    if b != (L, r, n_out):
      raise ValueError(f"{source}[{name!r}]['b'] has shape {b}; expected (L, r, out) = {(L, r, n_out)}")


def lora_value_and_grad(loss_fn: Callable, has_aux: bool = False) -> Callable:
  """f(lora, base, *args) -> (loss_fn(lora, base, *args), d loss / d lora).

  The base is closed over (behind `stop_gradient`), so differentiation allocates no gradient buffers for it.
  """
  def f(lora, base, *args, **kwargs):
    frozen = jax.lax.stop_gradient(base)
    return jax.value_and_grad(lambda l: loss_fn(l, frozen, *args, **kwargs), has_aux=has_aux)(lora)
  return f


def lora_delta(ab: dict, scale: float) -> jnp.ndarray:
  """The dense update a @ b * scale, f32 [L, in, out]."""
  return jnp.einsum("lir,lro->lio", ab["a"].astype(jnp.float32), ab["b"].astype(jnp.float32)) * scale


def merge_lora(params: dict, lora: dict, cfg: LoraConfig, requantize: bool = False) -> dict:
  """params with W <- W + a @ b * scale for every adapted linear (in f32, then back to W's dtype).

  A quantised kernel is dequantised first; `requantize=True` quantises the sum again with the same
  kind and settings, otherwise it stays dense in the dtype it was quantised from.
  """
  scale = lora_scale(cfg)
  layers = dict(params["layers"])
  for name, ab in lora.items():
    if name not in layers:
      raise ValueError(f"merge_lora: lora has {name!r} but params['layers'] does not; "
                       f"available: {[n for n in LINEAR_NAMES if n in layers]}")
    kernel = layers[name]["kernel"]
    if full_shape(kernel)[:2] != ab["a"].shape[:2] or full_shape(kernel)[-1] != ab["b"].shape[-1]:
      raise ValueError(f"merge_lora: {name!r} kernel {full_shape(kernel)} does not fit a {ab['a'].shape} "
                       f"@ b {ab['b'].shape}")
    dense = kernel.dequantize(jnp.float32) if is_quantized(kernel) else kernel.astype(jnp.float32)
    merged = (dense + lora_delta(ab, scale)).astype(kernel.dtype)
    if is_quantized(kernel) and requantize:
      if isinstance(kernel, NF4Tensor):
        merged = quantize_tensor(merged, "nf4", double_quant=kernel.double_quant, blocksize=kernel.blocksize)
      else:
        merged = quantize_tensor(merged, "int8")
    layers[name] = {**layers[name], "kernel": merged}
  return {**params, "layers": layers}
