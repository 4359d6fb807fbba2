"""Rotary position embeddings with the rope-scaling variants found in Hugging Face configs."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from fineflax.models.config import ModelConfig


def inv_frequencies(config: ModelConfig) -> np.ndarray:
  """inv_freq[j] = theta^(-2j/d), j < d/2, rescaled per `config.rope_scaling`.

  "linear": inv_freq / factor. "llama3" (Llama 3.1): wavelengths above
  original_max / low_freq_factor are divided by `factor`, those below original_max / high_freq_factor
  are kept, and the band between is interpolated smoothly.
  """
  d = config.head_dim
  inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
  scaling = config.rope_scaling_dict
  if not scaling:
    return inv_freq.astype(np.float32)
  kind = scaling.get("rope_type", scaling.get("type"))
  factor = float(scaling.get("factor", 1.0))
  if kind == "linear":
    inv_freq = inv_freq / factor
  elif kind == "llama3":
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    inv_freq = np.where(is_mid, mid, scaled)
  else:
    raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: linear, llama3)")
  return inv_freq.astype(np.float32)


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray, inv_freq: jnp.ndarray) -> jnp.ndarray:
  """Rotates x [B, T, H, D] by angle positions[b, t] * inv_freq (half-split layout, as transformers).

  out = x * cos + rotate_half(x) * sin, rotate_half([x1, x2]) = [-x2, x1]. Computed in f32.
  """
  angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, D/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  xf = x.astype(jnp.float32)
  x1, x2 = jnp.split(xf, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)
