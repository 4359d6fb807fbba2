"""Rotary position embeddings with the rope-scaling variants of Hugging Face configs, computed as
transformers' `modeling_rope_utils` computes them (float32 frequencies)."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from fineflax.models.config import ModelConfig
from fineflax.models.hf_config import SLIDING


def _base_inv_freq(theta, d: int):
  return 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))


def static_inv_freq(theta: float, scaling: dict | None, d: int, max_positions: int) -> tuple[np.ndarray, float]:
  """(inv_freq [d/2] f32, attention factor multiplying cos and sin) for every static rope type.

  default: theta^(-2j/d). "linear": / factor. "llama3" (Llama 3.1): wavelengths above
  original_max / low_freq_factor divided by `factor`, those below original_max / high_freq_factor kept,
  the band between interpolated smoothly. "yarn" (Peng et al. 2023): per-dimension blend of interpolated
  (/ factor) and original frequencies by a linear ramp between the correction dims of beta_fast and
  beta_slow rotations, and attention factor 0.1 ln(factor) + 1 (or from mscale / mscale_all_dim, or
  given). "dynamic" returns the unscaled frequencies (see `dynamic_inv_freq`).
  """
  inv_freq = _base_inv_freq(np.float32(theta), d)
  if not scaling:
    return inv_freq, 1.0
  kind = scaling["rope_type"]
  factor = float(scaling.get("factor", 1.0))
  if kind == "linear":
    return (inv_freq / np.float32(factor)).astype(np.float32), 1.0
  if kind == "dynamic":
    return inv_freq, 1.0
  if kind == "llama3":
    inv64 = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv64
    smooth = (old_len / wavelen - low) / (high - low)
    scaled = np.where(wavelen > old_len / low, inv64 / factor, inv64)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return np.where(is_mid, mid, scaled).astype(np.float32), 1.0
  if kind == "yarn":
    orig = float(scaling["original_max_position_embeddings"])
    attn = scaling.get("attention_factor")
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    get = lambda s, m=1.0: 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
    if attn is None:
      attn = get(factor, mscale) / get(factor, mscale_all) if (mscale and mscale_all) else get(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1
    corr = lambda rot: (d * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))
    low, high = corr(beta_fast), corr(beta_slow)
    if scaling.get("truncate", True):
      low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
      high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrap = (1 - ramp).astype(np.float32)
    pos_freqs = np.float32(theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
    inv = (1.0 / (np.float32(factor) * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
    return inv.astype(np.float32), float(attn)
  raise ValueError(f"rope_scaling type {kind!r} is not supported")


def dynamic_inv_freq(theta: float, scaling: dict, d: int, max_positions: int, seq_len) -> jnp.ndarray:
  """Dynamic NTK (transformers "dynamic"): with n = max(seq_len, max_position_embeddings), base =
  theta * (factor * n / max_position_embeddings - (factor - 1)) ^ (d / (d - 2)); inv_freq = base^(-2j/d).

  `seq_len` = max(position) + 1 of the call, as transformers computes it per forward (its cached growth
  across calls is monotone in decoding, so a KV cache rotated call by call matches transformers).
  """
  factor = float(scaling["factor"])
  n = jnp.maximum(jnp.asarray(seq_len, jnp.float32), float(max_positions))
  base = theta * ((factor * n / max_positions) - (factor - 1)) ** (d / (d - 2))
  return 1.0 / (base ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))


def layer_rope(config: ModelConfig, positions: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
  """(inv_freq [L, Dh/2], attention factor [L]) per layer: sliding layers use the local rope when the
  config has one (Gemma 3), others the global one."""
  c, d = config, config.head_dim
  def one(theta, scaling_items):
    scaling = dict(scaling_items) if scaling_items else None
    inv, attn = static_inv_freq(theta, scaling, d, c.max_position_embeddings)
    if scaling and scaling["rope_type"] == "dynamic":
      return dynamic_inv_freq(theta, scaling, d, c.max_position_embeddings, jnp.max(positions) + 1), attn
    return jnp.asarray(inv), attn
  g_inv, g_attn = one(c.rope_theta, c.rope_scaling)
  if c.local_rope_theta is None:
    return jnp.broadcast_to(g_inv, (c.num_layers, d // 2)), jnp.full((c.num_layers,), g_attn, jnp.float32)
  l_inv, l_attn = one(c.local_rope_theta, c.local_rope_scaling)
  types = c.layer_types or ("",) * c.num_layers
  local = np.array([t == SLIDING for t in types])
  inv = jnp.where(jnp.asarray(local)[:, None], l_inv[None], g_inv[None])
  return inv, jnp.asarray(np.where(local, l_attn, g_attn), jnp.float32)


def inv_frequencies(config: ModelConfig) -> np.ndarray:
  """The global (full-attention layers') static inv_freq [Dh/2] (see `static_inv_freq`)."""
  return static_inv_freq(config.rope_theta, config.rope_scaling_dict, config.head_dim,
                         config.max_position_embeddings)[0]


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray, inv_freq: jnp.ndarray,
               attention_factor=1.0) -> jnp.ndarray:
  """Rotates x [B, T, H, D] by angle positions[b, t] * inv_freq (half-split layout, as transformers).

  out = (x * cos + rotate_half(x) * sin) * attention_factor, rotate_half([x1, x2]) = [-x2, x1]. In f32.
  """
  angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, D/2]
  cos = (jnp.cos(angles) * attention_factor)[:, :, None, :]
  sin = (jnp.sin(angles) * attention_factor)[:, :, None, :]
  xf = x.astype(jnp.float32)
  x1, x2 = jnp.split(xf, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)
