"""An SFT phase inside an RL run: the first `rl.sft_steps` steps are supervised steps on the environment's
demonstrations (the same off-policy traces LUFFY mixes into its groups), the rest are RL steps.

  rl.sft_steps = 0              plain RL (default)
  rl.sft_steps >= num_steps     SFT only (the paper's "SFT" baseline)
  0 < rl.sft_steps < num_steps  SFT, then RL from the SFT adapter ("SFT+RL"); the optimizer state is reset
                                when RL starts, as two separate runs would do

An SFT step takes the `prompts_per_step` questions the RL step would take and minimises the token mean of
-log p(trace token | prompt, earlier trace tokens) under the untempered model (T = 1, the SFT job's loss
`fineflax.train.sft_step`), one optimizer update per step. Everything else (evaluation, checkpoints,
resume) is the one loop's.
"""
from __future__ import annotations

import numpy as np

from fineflax.rl.batch import build_rl_batch, round_up


def sft_batch(rows: dict, *, pad_id: int, max_new_tokens: int, multiple: int = 1) -> dict[str, np.ndarray]:
  """The [1, B, S] batch of `fineflax.train.sft_step` from demonstration rows (prompt, completion,
  loss_mask): tokens = prompt + completion, targets = the next token, loss_mask = the completion's mask
  moved onto the position that predicts each token. Rows are padded to a multiple of `multiple` (devices)
  with copies of row 0 whose loss mask is 0."""
  batch = build_rl_batch(rows["prompt"], rows["completion"], rows["loss_mask"], pad_id=pad_id,
                         completion_width=round_up(max_new_tokens, 32))
  tokens, mask = batch["tokens"], batch["mask"]
  b, s = tokens.shape
  n = mask.shape[1]
  targets = np.full_like(tokens, pad_id)
  targets[:, :-1] = tokens[:, 1:]
  loss_mask = np.zeros((b, s), np.float32)
  loss_mask[:, s - n - 1:s - 1] = mask  # hidden state t predicts token t + 1
  out = {"tokens": tokens, "targets": targets, "loss_mask": loss_mask,
         "attention_mask": batch["attention_mask"], "positions": batch["positions"]}
  extra = -b % multiple
  if extra:
    out = {k: np.concatenate([v, np.repeat(v[:1], extra, axis=0)]) for k, v in out.items()}
    out["loss_mask"][b:] = 0
  return {k: v[None] for k, v in out.items()}


def demonstration_rows(guidance, env, policy, items) -> dict:
  """The rows of one demonstration per item that has one (`Guidance.demonstrations`)."""
  from fineflax.rl import rows as R
  rows = R.empty_rows()
  for d in guidance.demonstrations(env, policy, items):
    if d is not None:
      R.extend(rows, d[0])
  if not rows["completion"]:
    raise ValueError("the SFT phase found no demonstration for any question of the step")
  return rows
