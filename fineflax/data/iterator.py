"""Batches from a Mixture: chat formatting, truncation, then packing or length bucketing.

packing=True: each example (n - 1 positions after `shift`) goes into the first of the batch's rows with
room (`first_fit`, rows of `max_length`); the first example that fits no row closes the batch and opens
the next one. packing=False: one example per row, the batch padded to the smallest bucket that holds its
longest example (`buckets`, default `default_buckets(max_length)`), so jit sees few shapes.

Examples longer than max_length + 1 ids are cut by `truncation` ("right" keeps the start, "left" keeps the
end, "drop" skips them); examples left without any assistant target are skipped. Both are counted in
`stats`.

`state()` is `{"mixture": <Mixture.state() before the first example not yet in a batch>, "batches": k,
"stats": {...}}`; `restore(state)` re-reads that example, so a resumed run yields identical batches.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fineflax.data.chat import tokenize_chat
from fineflax.data.mixture import Mixture
from fineflax.data.sources import DataError
from fineflax.data.packing import (TRUNCATION, assemble, bucket_width, default_buckets, first_fit, shift,
                                   truncate)

STAT_KEYS = ("examples", "truncated", "dropped_too_long", "dropped_no_loss")


def pad_id_of(tokenizer) -> int:
  for attr in ("pad_token_id", "eos_token_id"):
    v = getattr(tokenizer, attr, None)
    if isinstance(v, int):
      return v
  return 0


class BatchIterator:
  """Endless iterator of batch dicts (see `fineflax.data` for the arrays) with `state()`/`restore()`."""

  def __init__(self, mixture: Mixture, tokenizer, batch_size: int, max_length: int, *,
               packing: bool = True, truncation: str = "right", buckets: Sequence[int] | None = None,
               pad_id: int | None = None):
    if batch_size < 1 or max_length < 2:
      raise ValueError(f"batch_size={batch_size} must be >= 1 and max_length={max_length} >= 2")
    if truncation not in TRUNCATION:
      raise ValueError(f"truncation={truncation!r}; choose one of {list(TRUNCATION)}")
    self.mixture, self.tokenizer = mixture, tokenizer
    self.batch_size, self.max_length = batch_size, max_length
    self.packing, self.truncation = packing, truncation
    self.buckets = tuple(sorted(buckets)) if buckets else default_buckets(max_length)
    if self.buckets[-1] < max_length:
      raise ValueError(f"buckets {self.buckets} must reach max_length={max_length}")
    self.pad_id = pad_id_of(tokenizer) if pad_id is None else int(pad_id)
    self.batches = 0
    self.stats = dict.fromkeys(STAT_KEYS, 0)
    self._pending = None  # ((mixture state, stats) before it, sequence): drawn, not yet in a batch

  def encode(self, example: dict):
    """(tokens, targets, loss) of one example, or None when it is dropped (counted in stats)."""
    try:
      ids, assistant = tokenize_chat(self.tokenizer, example["messages"])
    except Exception as e:
      where = example.get("where", example.get("source", "<example>"))
      raise DataError(f"{where}: cannot format the messages ({type(e).__name__}: {e})") from e
    kept = truncate(ids, assistant, self.max_length + 1, self.truncation)
    if kept is None:
      self.stats["dropped_too_long"] += 1
      return None
    self.stats["truncated"] += int(len(kept[0]) < len(ids))
    seq = shift(*kept)
    if not seq[2].any():
      self.stats["dropped_no_loss"] += 1
      return None
    self.stats["examples"] += 1
    return seq

  def _draw(self):
    """((mixture state, stats) before the draw, sequence) of the next example that is not dropped."""
    while True:
      before = (self.mixture.state(), dict(self.stats))
      seq = self.encode(next(self.mixture))
      if seq is not None:
        return before, seq

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if not self.packing:
      seqs = [self._draw()[1] for _ in range(self.batch_size)]
      width = bucket_width(max(len(s[0]) for s in seqs), self.buckets)
      batch = assemble([[s] for s in seqs], width, self.pad_id)
    else:
      rows, fill = [[] for _ in range(self.batch_size)], [0] * self.batch_size
      while True:
        item, self._pending = (self._pending or self._draw()), None
        r = first_fit(fill, len(item[1][0]), self.max_length)
        if r < 0:
          self._pending = item
          break
        rows[r].append(item[1])
        fill[r] += len(item[1][0])
      batch = assemble(rows, self.max_length, self.pad_id)
    self.batches += 1
    return batch

  def state(self) -> dict:
    if self._pending is not None:
      mixture, stats = self._pending[0]
    else:
      mixture, stats = self.mixture.state(), self.stats
    return {"mixture": mixture, "batches": self.batches, "stats": dict(stats)}

  def restore(self, state: dict) -> None:
    self.mixture.restore(state["mixture"])
    self.batches = int(state["batches"])
    self.stats = {k: int(state["stats"].get(k, 0)) for k in STAT_KEYS}
    self._pending = None


def make_batch_iterator(mixture: Mixture, tokenizer, batch_size: int, max_length: int, *,
                        packing: bool = True, truncation: str = "right",
                        buckets: Sequence[int] | None = None, pad_id: int | None = None) -> BatchIterator:
  """Batches of `batch_size` rows from `mixture` (see the module docstring and `fineflax.data`)."""
  return BatchIterator(mixture, tokenizer, batch_size, max_length, packing=packing,
                       truncation=truncation, buckets=buckets, pad_id=pad_id)
