"""Per-row LoRA adapters of the engine: several adapters served in one batch (the server's multi-LoRA).

    stacked, scales = stack_adapters([(lora_a, 2.0), (lora_b, 0.5)], config)
    weights = row_weights([None, 0, 1, 0], scales)        # [B, A]: rows of the base, adapter 0, 1, 0

Layout: for every linear any adapter targets, a [L, A, in, R] and b [L, A, R, out] (R = the largest rank;
an adapter of lower rank is zero-padded, one that does not target the linear is all zeros: both add
exactly nothing). Row b's weights w[b] = scale_i * onehot(i) for its adapter i (zeros for the base), so
the decoder's per-row path (`models.decoder.lora_up`) adds sum_j w[b, j] x @ a_j @ b_j = the row's own
adapter, x @ a_i @ b_i * scale_i. Each step reads every adapter's factors once (not once per row).
"""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from fineflax.models.decoder import LINEAR_NAMES


def stack_adapters(adapters: Sequence[tuple[dict, float]], config) -> tuple[dict, np.ndarray]:
  """({name: {"a": [L, A, in, R], "b": [L, A, R, out]}} f32, scales f32 [A]) from [(lora, scale), ...]
  (lora as `fineflax.lora`: {name: {"a": [L, in, r], "b": [L, r, out]}}); see the module docstring."""
  if not adapters:
    raise ValueError("stack_adapters(): no adapters")
  shapes, count = config.linear_shapes(), len(adapters)
  stacked = {}
  for name in LINEAR_NAMES:
    parts = [(i, lora[name]) for i, (lora, _) in enumerate(adapters) if name in lora]
    if not parts:
      continue
    rank = max(int(ab["a"].shape[-1]) for _, ab in parts)
    (n_in, n_out), layers = shapes[name], config.num_layers
    a = np.zeros((layers, count, n_in, rank), np.float32)
    b = np.zeros((layers, count, rank, n_out), np.float32)
    for i, ab in parts:
      r = int(ab["a"].shape[-1])
      if tuple(ab["a"].shape) != (layers, n_in, r) or tuple(ab["b"].shape) != (layers, r, n_out):
        raise ValueError(f"adapter {i}, linear {name!r}: a {tuple(ab['a'].shape)}, b {tuple(ab['b'].shape)}; "
                         f"expected [{layers}, {n_in}, r] and [{layers}, r, {n_out}]")
      a[:, i, :, :r], b[:, i, :r, :] = np.asarray(ab["a"], np.float32), np.asarray(ab["b"], np.float32)
    stacked[name] = {"a": jnp.asarray(a), "b": jnp.asarray(b)}
  return stacked, np.asarray([float(s) for _, s in adapters], np.float32)


def row_weights(adapter_ids: Sequence[int | None], scales: np.ndarray) -> np.ndarray:
  """f32 [B, A]: row b's weight of each adapter (scale of its own, 0 elsewhere; all 0 for None = base)."""
  out = np.zeros((len(adapter_ids), len(scales)), np.float32)
  for r, i in enumerate(adapter_ids):
    if i is not None:
      out[r, i] = scales[i]
  return out
