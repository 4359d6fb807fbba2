"""From prompts and sampled completions to the RL batch of `fineflax.rl.step` (NumPy)."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def round_up(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


def build_rl_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                   loss_masks: Sequence[Sequence[float]], *, pad_id: int, prompt_width: int | None = None,
                   completion_width: int | None = None, width_multiple: int = 32) -> dict[str, np.ndarray]:
  """Left-pads prompts to P and right-pads completions to N; positions count real tokens only.

  Returns tokens/attention_mask/positions [B, P + N], completion/mask [B, N]. Widths round up to
  `width_multiple` so that a jitted step sees few distinct shapes.
  """
  if not (len(prompts) == len(completions) == len(loss_masks)):
    raise ValueError(f"{len(prompts)} prompts, {len(completions)} completions, {len(loss_masks)} masks")
  p = prompt_width or round_up(max(len(x) for x in prompts), width_multiple)
  n = completion_width or round_up(max(max((len(c) for c in completions), default=1), 1), width_multiple)
  b = len(prompts)
  tokens = np.full((b, p + n), pad_id, np.int32)
  attn = np.zeros((b, p + n), np.int32)
  mask = np.zeros((b, n), np.float32)
  for i, (pr, co, lm) in enumerate(zip(prompts, completions, loss_masks)):
    if len(pr) > p or len(co) > n:
      raise ValueError(f"row {i}: prompt {len(pr)} > {p} or completion {len(co)} > {n} tokens")
    if len(lm) != len(co):
      raise ValueError(f"row {i}: loss mask has {len(lm)} entries for {len(co)} completion tokens")
    tokens[i, p - len(pr):p] = pr
    tokens[i, p:p + len(co)] = co
    attn[i, p - len(pr):p + len(co)] = 1
    mask[i, :len(co)] = lm
  positions = np.maximum(np.cumsum(attn, axis=1) - 1, 0).astype(np.int32)
  return {"tokens": tokens, "attention_mask": attn, "positions": positions,
          "completion": tokens[:, p:].copy(), "mask": mask}


def sample_rows(out, mask_truncated: bool = False) -> tuple[list[list[int]], list[list[float]]]:
  """Per-row completion tokens and loss masks from a `SampleOutput` (mask = model tokens only).

  mask_truncated: rows that hit the length limit get an all-zero mask (DAPO overlong filtering).
  """
  comps, masks = [], []
  for i in range(out.tokens.shape[0]):
    n = int(out.lengths[i])
    comps.append(out.tokens[i, :n].tolist())
    m = out.mask[i, :n].astype(np.float32)
    if mask_truncated and out.finish_reason[i] == "length":
      m = np.zeros_like(m)
    masks.append(m.tolist())
  return comps, masks
