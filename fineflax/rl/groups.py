"""Rollout groups for GRPO-family training: on-policy samples, LUFFY traces, ExGRPO replays.

A group is the K rows of one question. Rows are kept as parallel lists in a dict:
  prompt (token list), completion (token list), loss_mask (float list), text (str),
  off_policy (bool: LUFFY trace or ExGRPO replay), behaviour_logp (float list: recorded log-probs of a
  replayed trajectory, zeros elsewhere), rollout_logp (float list: log-probs of the sampling distribution, i.e. of softmax(logits / T), the
  policy the loss differentiates).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fineflax.rl.rollout import sample_rows

FIELDS = ("prompt", "completion", "loss_mask", "text", "off_policy", "behaviour_logp", "rollout_logp")


def empty_rows() -> dict[str, list]:
  return {f: [] for f in FIELDS}


def extend(rows: dict, other: dict) -> dict:
  for f in FIELDS:
    rows[f] += other[f]
  return rows


def sampled_rows(prompts: Sequence[Sequence[int]], out, mask_truncated: bool) -> dict:
  """Rows of on-policy samples from a `SampleOutput` (same order as `prompts`)."""
  comps, masks = sample_rows(out, mask_truncated=mask_truncated)
  logps = [out.logprobs[i, :len(c)].tolist() for i, c in enumerate(comps)]
  return {"prompt": [list(p) for p in prompts], "completion": comps, "loss_mask": masks,
          "text": list(out.texts), "off_policy": [False] * len(comps),
          "behaviour_logp": [[0.0] * len(c) for c in comps], "rollout_logp": logps}


def fixed_row(prompt: Sequence[int], completion: Sequence[int], text: str,
              behaviour_logp: Sequence[float] | None = None) -> dict:
  """One off-policy row: a LUFFY trace (behaviour prob 1) or an ExGRPO replay (recorded log-probs)."""
  n = len(completion)
  lp = [0.0] * n if behaviour_logp is None else [float(x) for x in behaviour_logp]
  return {"prompt": [list(prompt)], "completion": [list(completion)], "loss_mask": [[1.0] * n],
          "text": [text], "off_policy": [True], "behaviour_logp": [lp], "rollout_logp": [lp]}


def interleave_groups(on: dict, n_on: int, off: list[dict]) -> dict:
  """Group g = on-policy rows [g*n_on, (g+1)*n_on) followed by the off-policy rows of off[g]."""
  rows = empty_rows()
  for g, extra in enumerate(off):
    part = {f: on[f][g * n_on:(g + 1) * n_on] for f in FIELDS}
    extend(rows, part)
    extend(rows, extra)
  return rows


def pad_ragged(lists: Sequence[Sequence[float]], width: int) -> np.ndarray:
  """[B, width] float32 from ragged lists (right-padded with zeros)."""
  out = np.zeros((len(lists), width), np.float32)
  for i, x in enumerate(lists):
    out[i, :len(x)] = x
  return out
