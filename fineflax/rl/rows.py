"""Rollout rows for GRPO-family training: the one builder of on-policy samples, off-policy traces and
ExGRPO replays.

A group is the K rows of one question. Rows are kept as parallel lists in a dict:
  prompt (token list), completion (token list), loss_mask (float list: 1 = a policy token that enters
  the loss, 0 = inserted tool text), text (str), off_policy (bool: LUFFY trace or ExGRPO replay),
  behaviour_logp (float list: recorded log-probs of a replayed trajectory, zeros elsewhere),
  rollout_logp (float list: log-probs of the sampling distribution softmax(logits / T), the policy the
  loss differentiates; zeros for traces).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

FIELDS = ("prompt", "completion", "loss_mask", "text", "off_policy", "behaviour_logp", "rollout_logp")


def empty_rows() -> dict[str, list]:
  return {f: [] for f in FIELDS}


def extend(rows: dict, other: dict) -> dict:
  for f in FIELDS:
    rows[f] += other[f]
  return rows


def take(rows: dict, index: Sequence[int]) -> dict:
  """The rows at `index`, in that order."""
  return {f: [rows[f][i] for i in index] for f in FIELDS}


def make_rows(prompts, completions, loss_masks, texts, *, off_policy: bool,
              rollout_logp=None, behaviour_logp=None) -> dict:
  """Rows from parallel per-row lists; missing log-probs are zeros of each completion's length."""
  zeros = [[0.0] * len(c) for c in completions]
  return {"prompt": [list(p) for p in prompts], "completion": [list(c) for c in completions],
          "loss_mask": [[float(x) for x in m] for m in loss_masks], "text": list(texts),
          "off_policy": [off_policy] * len(completions),
          "behaviour_logp": zeros if behaviour_logp is None else [[float(x) for x in b] for b in behaviour_logp],
          "rollout_logp": zeros if rollout_logp is None else [[float(x) for x in r] for r in rollout_logp]}


def sampled_rows(prompts: Sequence[Sequence[int]], out, mask_truncated: bool = False) -> dict:
  """Rows of on-policy samples from a `SampleOutput` (same order as `prompts`); mask = model tokens.

  mask_truncated: rows that hit the length limit get an all-zero mask (DAPO overlong filtering).
  """
  comps, masks, logps = [], [], []
  for i in range(out.tokens.shape[0]):
    n = int(out.lengths[i])
    comps.append(out.tokens[i, :n].tolist())
    m = out.mask[i, :n].astype(np.float32)
    if mask_truncated and out.finish_reason[i] == "length":
      m = np.zeros_like(m)
    masks.append(m.tolist())
    logps.append(out.logprobs[i, :n].tolist())
  return make_rows(prompts, comps, masks, list(out.texts), off_policy=False, rollout_logp=logps)


def fixed_row(prompt: Sequence[int], completion: Sequence[int], text: str,
              behaviour_logp: Sequence[float] | None = None, loss_mask: Sequence[float] | None = None
              ) -> dict:
  """One off-policy row: a LUFFY trace (behaviour prob 1: log-probs 0) or an ExGRPO replay (its
  recorded log-probs, which are also its rollout log-probs)."""
  mask = [1.0] * len(completion) if loss_mask is None else loss_mask
  lp = None if behaviour_logp is None else [list(behaviour_logp)]
  return make_rows([prompt], [completion], [mask], [text], off_policy=True, rollout_logp=lp,
                   behaviour_logp=lp)
