"""Truncation, next-token shifting, first-fit packing and padding into the batch dict (pure NumPy).

An example is (ids [n], assistant [n]). `shift` turns it into a sequence of n - 1 positions:
tokens = ids[:-1], targets = ids[1:], loss = assistant[1:] (the loss of position t is on predicting
ids[t+1]). Sequences are packed whole, so a target never belongs to another segment: the last token of
one segment is never trained to predict the first token of the next.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

TRUNCATION = ("left", "right", "drop")
Sequence_ = tuple[np.ndarray, np.ndarray, np.ndarray]  # tokens, targets, loss (each [L])


def truncate(ids: np.ndarray, assistant: np.ndarray, max_ids: int, policy: str):
  """Keeps at most `max_ids` ids: "right" keeps the first ones, "left" the last ones, "drop" -> None."""
  if policy not in TRUNCATION:
    raise ValueError(f"truncation={policy!r}; choose one of {list(TRUNCATION)}")
  if len(ids) <= max_ids:
    return ids, assistant
  if policy == "drop":
    return None
  if policy == "right":
    return ids[:max_ids], assistant[:max_ids]
  return ids[-max_ids:], assistant[-max_ids:]


def shift(ids: np.ndarray, assistant: np.ndarray) -> Sequence_:
  """(tokens, targets, loss) = (ids[:-1], ids[1:], assistant[1:] as float32)."""
  return ids[:-1].astype(np.int32), ids[1:].astype(np.int32), assistant[1:].astype(np.float32)


def first_fit(fill: Sequence[int], length: int, capacity: int) -> int:
  """Index of the first row whose fill + length <= capacity, or -1."""
  for r, f in enumerate(fill):
    if f + length <= capacity:
      return r
  return -1


def default_buckets(max_length: int, smallest: int = 32) -> tuple[int, ...]:
  """Powers of two from `smallest` below max_length, then max_length."""
  out, w = [], smallest
  while w < max_length:
    out.append(w)
    w *= 2
  return tuple(out) + (max_length,)


def bucket_width(length: int, buckets: Sequence[int]) -> int:
  """The smallest bucket >= length."""
  for b in sorted(buckets):
    if b >= length:
      return b
  raise ValueError(f"length {length} exceeds the largest bucket {max(buckets)}")


def assemble(rows: Sequence[Sequence[Sequence_]], width: int, pad_id: int) -> dict[str, np.ndarray]:
  """The batch dict for rows of sequences (one or several per row), right-padded to `width`.

  segment_ids count 1, 2, ... within a row (0 = padding); positions restart at 0 in each segment.
  """
  b = len(rows)
  batch = {
      "tokens": np.full((b, width), pad_id, np.int32),
      "targets": np.full((b, width), pad_id, np.int32),
      "loss_mask": np.zeros((b, width), np.float32),
      "attention_mask": np.zeros((b, width), np.int32),
      "positions": np.zeros((b, width), np.int32),
      "segment_ids": np.zeros((b, width), np.int32),
  }
  for r, row in enumerate(rows):
    at = 0
    for s, (tokens, targets, loss) in enumerate(row, start=1):
      n = len(tokens)
      if at + n > width:
        raise ValueError(f"row {r}: sequences of total length {at + n} exceed the width {width}")
      sl = slice(at, at + n)
      batch["tokens"][r, sl] = tokens
      batch["targets"][r, sl] = targets
      batch["loss_mask"][r, sl] = loss
      batch["attention_mask"][r, sl] = 1
      batch["positions"][r, sl] = np.arange(n)
      batch["segment_ids"][r, sl] = s
      at += n
  return batch


def repack(batches: Sequence[dict], width: int, rows_multiple: int, pad_id: int) -> list[dict]:
  """The sequences of `batches` (batch dicts of this module, one segment or several a row) packed again,
  whole, first-fit by decreasing length into rows of `width` tokens; the rows grouped `rows_multiple` at a
  time (one per device) into micro-batches [rows_multiple, width] (the last filled with empty rows).
  A sequence longer than `width` is an error naming config.train.micro_batch_tokens."""
  seqs = []
  for batch in batches:
    seg = np.asarray(batch["segment_ids"])
    for r in range(seg.shape[0]):
      for s in np.unique(seg[r][seg[r] > 0]):
        at = np.flatnonzero(seg[r] == s)
        seqs.append(tuple(np.asarray(batch[k])[r, at] for k in ("tokens", "targets", "loss_mask")))
  longest = max((len(s[0]) for s in seqs), default=0)
  if longest > width:
    raise ValueError(f"config.train.micro_batch_tokens={width}: a sequence holds {longest} tokens; the budget "
                     "must be at least data.max_length")
  fill: list[int] = []
  rows: list[list] = []
  for i in sorted(range(len(seqs)), key=lambda i: -len(seqs[i][0])):
    r = first_fit(fill, len(seqs[i][0]), width)
    if r < 0:
      fill.append(0)
      rows.append([])
      r = len(fill) - 1
    fill[r] += len(seqs[i][0])
    rows[r].append(seqs[i])
  rows += [[] for _ in range(-len(rows) % rows_multiple or (0 if rows else rows_multiple))]
  return [assemble(rows[i:i + rows_multiple], width, pad_id) for i in range(0, len(rows), rows_multiple)]
