"""From rollout rows to the padded NumPy batch of `fineflax.rl.step`."""
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


def pad_ragged(lists: Sequence[Sequence[float]], width: int) -> np.ndarray:
  """[B, width] float32 from ragged lists (right-padded with zeros)."""
  out = np.zeros((len(lists), width), np.float32)
  for i, x in enumerate(lists):
    out[i, :len(x)] = x
  return out


def pad_rows(batch: dict, multiple: int) -> dict:
  """The batch with copies of row 0 appended up to a multiple of `multiple` rows (fewer distinct shapes to
  compile, or rows that split evenly over devices). The copies are real token rows (no all-padding row
  reaches attention) with mask 0, advantage 0 and on-policy, so they add nothing to any loss or masked
  metric, and `num_rows` (the real B) keeps the seq-mean losses unchanged. 0-d fields stay as they are."""
  b = batch["tokens"].shape[0]
  extra = -b % multiple
  if not extra:
    return batch
  out = {k: np.concatenate([np.asarray(v), np.repeat(np.asarray(v)[:1], extra, axis=0)]) if np.ndim(v) else v
         for k, v in batch.items()}
  for k in ("mask", "advantages", "is_off_policy", "response_mask"):
    if k in out:
      out[k][b:] = 0
  out["num_rows"] = np.float32(b)
  return out
