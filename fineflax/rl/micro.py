"""Packed micro-batches of an RL update (verl's dynamic batch size: `use_dynamic_bsz` with
`ppo_max_token_len_per_gpu`, rows without padding), host NumPy.

A batch of `fineflax.rl.step` ([B, S] sequences: left-padded prompt of width P, completion of width N;
per-token fields [B, N]; per-row fields [B]) becomes micro-batches of D rows [D, T] (D = devices, one
packed row each; T = the token budget `rl.micro_batch_tokens`):
  - each row's real tokens (its p prompt + c completion tokens, p + c <= T) sit whole in one packed row as
    its own segment (segment_ids 1, 2, ... in placement order, 0 = padding; positions 0 .. p + c - 1),
    rows placed first-fit by decreasing length (`fineflax.data.packing.first_fit`);
  - per-token fields are laid out by predicting position: completion token j of a row placed at offset o
    goes to o + p - 1 + j (the hidden state there predicts it; `completion` holds the token itself),
    per-row fields are broadcast over the row's completion positions; other positions hold zeros (mask 0);
  - scalars are copied to every micro-batch.
`unpack` maps per-token outputs ([D, T] per micro-batch, e.g. log-probs) back to [B, N].
The number of micro-batches varies with the lengths; each has the same shape [D, T], so one compiled
micro-step serves them all (`fineflax.train.grad_accum`).
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from fineflax.data.packing import first_fit

SEQUENCE_FIELDS = ("tokens", "attention_mask", "positions")


@dataclasses.dataclass(frozen=True)
class PackLayout:
  """Where every token of a [B, S] batch goes in [bins, T] packed rows (bins = micro-batches x D)."""
  rows: int
  completion_width: int
  width: int
  devices: int
  bins: int
  seq_src: tuple[np.ndarray, np.ndarray]  # (row, column) of every real token in the [B, S] batch
  seq_dst: tuple[np.ndarray, np.ndarray]  # (bin, column) of that token packed
  seq_segment: np.ndarray
  seq_position: np.ndarray
  tok_src: tuple[np.ndarray, np.ndarray]  # (row, j) of every real completion token, j < N
  tok_dst: tuple[np.ndarray, np.ndarray]  # (bin, column) of the position predicting it

  @property
  def num_micro(self) -> int:
    return self.bins // self.devices


def pack_layout(attention_mask, completion_width: int, budget: int, devices: int = 1) -> PackLayout:
  """The layout of a batch with this attention mask [B, S] (completion = its last N columns) in
  micro-batches of `devices` rows of `budget` tokens. A row longer than the budget is an error naming
  `config.rl.micro_batch_tokens`."""
  am = np.asarray(attention_mask).astype(bool)
  b, s = am.shape
  n = completion_width
  lengths = am.sum(1)
  prompt = am[:, :s - n].sum(1)
  comp = lengths - prompt
  if b and lengths.max() > budget:
    i = int(lengths.argmax())
    raise ValueError(f"config.rl.micro_batch_tokens={budget}: row {i} holds {int(lengths[i])} tokens "
                     f"(prompt + completion); the budget must be at least the longest row")
  if ((prompt == 0) & (comp > 0)).any():
    raise ValueError("a row with a completion and no prompt token: its first token has no predicting position")
  fill: list[int] = []
  where, offset, segment = (np.zeros(b, np.int64) for _ in range(3))
  count: list[int] = []
  for i in np.argsort(-lengths, kind="stable"):
    r = first_fit(fill, int(lengths[i]), budget)
    if r < 0:
      fill.append(0)
      count.append(0)
      r = len(fill) - 1
    where[i], offset[i] = r, fill[r]
    fill[r] += int(lengths[i])
    count[r] += 1
    segment[i] = count[r]
  bins = max(devices, -(-len(fill) // devices) * devices)
  seq_r, seq_c, dst_b, dst_c, seg, pos, tok_r, tok_j, tok_b, tok_c = ([] for _ in range(10))
  for i in range(b):
    cols = np.flatnonzero(am[i])
    length = len(cols)
    seq_r.append(np.full(length, i))
    seq_c.append(cols)
    dst_b.append(np.full(length, where[i]))
    dst_c.append(offset[i] + np.arange(length))
    seg.append(np.full(length, segment[i]))
    pos.append(np.arange(length))
    j = np.arange(comp[i])
    tok_r.append(np.full(comp[i], i))
    tok_j.append(j)
    tok_b.append(np.full(comp[i], where[i]))
    tok_c.append(offset[i] + prompt[i] - 1 + j)
  cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64)
  return PackLayout(rows=b, completion_width=n, width=budget, devices=devices, bins=bins,
                    seq_src=(cat(seq_r), cat(seq_c)), seq_dst=(cat(dst_b), cat(dst_c)),
                    seq_segment=cat(seg), seq_position=cat(pos),
                    tok_src=(cat(tok_r), cat(tok_j)), tok_dst=(cat(tok_b), cat(tok_c)))


def pack(batch: dict, layout: PackLayout, pad_id: int) -> list[dict]:
  """The micro-batches ([D, T] arrays) of `batch` (module docstring); `num_rows` is dropped (a packed
  micro-batch is normalised by the whole batch's `loss_weights` / `num_tokens` instead)."""
  shape = (layout.bins, layout.width)
  out = {"tokens": np.full(shape, pad_id, np.int32), "attention_mask": np.zeros(shape, np.int32),
         "positions": np.zeros(shape, np.int32), "segment_ids": np.zeros(shape, np.int32)}
  out["tokens"][layout.seq_dst] = np.asarray(batch["tokens"])[layout.seq_src]
  out["attention_mask"][layout.seq_dst] = 1
  out["positions"][layout.seq_dst] = layout.seq_position
  out["segment_ids"][layout.seq_dst] = layout.seq_segment
  scalars = {}
  for k, v in batch.items():
    if k in SEQUENCE_FIELDS or k == "num_rows":
      continue
    v = np.asarray(v)
    if v.ndim == 0:
      scalars[k] = v
      continue
    if v.shape[0] != layout.rows or v.ndim > 2 or (v.ndim == 2 and v.shape[1] != layout.completion_width):
      raise ValueError(f"field {k!r} of shape {v.shape} is neither per row [{layout.rows}] nor per "
                       f"completion token [{layout.rows}, {layout.completion_width}]")
    x = np.zeros(shape, v.dtype)
    x[layout.tok_dst] = v[layout.tok_src] if v.ndim == 2 else v[layout.tok_src[0]]
    out[k] = x
  d = layout.devices
  return [{**{k: v[m * d:(m + 1) * d] for k, v in out.items()}, **scalars} for m in range(layout.num_micro)]


def unpack(per_micro, layout: PackLayout) -> np.ndarray:
  """[B, N] from per-token outputs of the micro-batches (a list of [D, T] arrays, in order); zeros
  beyond each row's completion."""
  x = np.concatenate([np.asarray(a) for a in per_micro])
  out = np.zeros((layout.rows, layout.completion_width), x.dtype)
  out[layout.tok_src] = x[layout.tok_dst]
  return out


def to_host(x) -> np.ndarray:
  """A (possibly row-sharded) device array as one NumPy array on every process."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))
