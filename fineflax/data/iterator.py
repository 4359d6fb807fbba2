"""Batches from a Mixture: chat formatting, truncation, then packing or length bucketing.

packing=True: each example (n - 1 positions after `shift`) goes into the first of the batch's rows with
room (`first_fit`, rows of `max_length`); the first example that fits no row closes the batch and opens
the next one. packing=False: one example per row, the batch padded to the smallest bucket that holds its
longest example (`buckets`, default `default_buckets(max_length)`), so jit sees few shapes.

Examples longer than max_length + 1 ids are cut by `truncation` ("right" keeps the start, "left" keeps the
end, "drop" skips them); examples left without any assistant target are skipped (`fineflax.data.prepare`).
Both are counted in `stats` and, per source, in `source_stats`. A source whose dropped share passes
`warn_dropped_share` (checked once it has given min(WARN_AFTER, its rows) examples) is reported once with a
logging warning. Dropping is a function of the row alone, so when every row of every source (weight > 0)
has been dropped no batch can ever be made: the iterator raises DataError saying how many rows were dropped
and why, e.g. "tools_glaive.jsonl: all 200 rows dropped: no assistant token within max_length=64; the
shortest prompt is 123 tokens". It also raises after `max_dropped_in_a_row` drops before the first kept
example (a huge source whose rows are all dropped would take long to exhaust).
`summary()` is a JSON-able dict of those counts and of the rows each source skipped when it was loaded
(on_bad_row="skip").

`state()` is `{"mixture": <Mixture.state() before the first example not yet in a batch>, "batches": k,
"stats": {...}}`; `restore(state)` re-reads that example, so a resumed run yields identical batches.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from fineflax.data.mixture import Mixture
from fineflax.data.packing import TRUNCATION, assemble, bucket_width, default_buckets, first_fit
from fineflax.data.prepare import account, drop_summary, dropped, new_source_stats, prepare
from fineflax.data.sources import DataError

STAT_KEYS = ("examples", "truncated", "dropped_too_long", "dropped_no_loss")
WARN_AFTER = 50  # examples of a source before its dropped share is judged
_log = logging.getLogger("fineflax.data")


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
               pad_id: int | None = None, warn_dropped_share: float = 0.1,
               max_dropped_in_a_row: int = 2000):
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
    self.warn_dropped_share, self.max_dropped_in_a_row = warn_dropped_share, max_dropped_in_a_row
    self.batches = 0
    self.stats = dict.fromkeys(STAT_KEYS, 0)
    self.sources = list(getattr(mixture, "sources", []))
    self.source_stats = [new_source_stats(src.name) for src in self.sources] or [new_source_stats("<data>")]
    self._reset_watch()
    self._pending = None  # ((mixture state, stats, source stats) before it, sequence): not yet batched

  def _reset_watch(self):
    """Drop watching state (not saved: it restarts after `restore`). A source is read in epochs (each row
    once per epoch, `Mixture`), so once its draws since `start` reach the next epoch boundary plus one
    whole epoch without a kept example, every one of its rows has been dropped."""
    self._warned = [False] * len(self.source_stats)
    self._start = list(getattr(self.mixture, "counts", None) or [0] * len(self.source_stats))
    self._draws = [0] * len(self.source_stats)  # draws of each source since start
    self._kept = [0] * len(self.source_stats)
    self._dropped_in_a_row = 0

  def _exhausted(self, j: int) -> bool:
    """Whether every row of source j was drawn since start and dropped."""
    n = len(self.sources[j])
    return not self._kept[j] and self._draws[j] >= (-self._start[j]) % n + n

  def encode(self, example: dict):
    """(tokens, targets, loss) of one example, or None when it is dropped (counted in stats)."""
    try:
      p = prepare(self.tokenizer, example["messages"], self.max_length, self.truncation)
    except Exception as e:
      where = example.get("where", example.get("source", "<example>"))
      raise DataError(f"{where}: cannot format the messages ({type(e).__name__}: {e})") from e
    j = int(example.get("source_index", 0)) if len(self.source_stats) > 1 else 0
    account(self.source_stats[j], p)
    self._draws[j] += 1
    if p.seq is None:
      self.stats[p.reason] += 1
      self._dropped_in_a_row += 1
    else:
      self.stats["examples"] += 1
      self.stats["truncated"] += int(p.truncated)
      self._kept[j] += 1
      self._dropped_in_a_row = 0
    self._watch(j)
    return p.seq

  def _describe(self, j: int) -> str:
    return drop_summary(self.source_stats[j], self.max_length, self.truncation)

  def _watch(self, j: int) -> None:
    """Warns once when source j's dropped share passes the threshold; raises when nothing can be kept."""
    st = self.source_stats[j]
    n = len(self.sources[j]) if self.sources else None
    if not self._warned[j] and st["drawn"] >= min(WARN_AFTER, n or WARN_AFTER):
      share = dropped(st) / st["drawn"]
      if share > self.warn_dropped_share:
        self._warned[j] = True
        _log.warning("%s: %d of %d examples dropped (%.0f%%, over the %.0f%% warning threshold): %s",
                     st["name"], dropped(st), st["drawn"], 100 * share, 100 * self.warn_dropped_share,
                     self._describe(j))
    if self.sources:
      weights = getattr(self.mixture, "weights", np.ones(len(self.sources)))
      live = [k for k in range(len(self.sources)) if weights[k] > 0]
      if all(self._exhausted(k) for k in live):
        parts = [f"{self.source_stats[k]['name']}: all {len(self.sources[k])} rows dropped: "
                 f"{self._describe(k)}" for k in live]
        raise DataError("; ".join(parts) + " (raise max_length or shorten the prompts)")
    if not any(self._kept) and self._dropped_in_a_row >= self.max_dropped_in_a_row:
      parts = [f"{st['name']}: {dropped(st)} of {st['drawn']} dropped: "
               f"{drop_summary(st, self.max_length, self.truncation)}"
               for st in self.source_stats if dropped(st)]
      raise DataError(f"the first {self._dropped_in_a_row} examples were all dropped; " + "; ".join(parts))

  def _draw(self):
    """((mixture state, stats, source stats) before the draw, sequence) of the next kept example."""
    while True:
      before = (self.mixture.state(), dict(self.stats), [dict(s) for s in self.source_stats])
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
      mixture, stats, sources = self._pending[0]
    else:
      mixture, stats, sources = self.mixture.state(), self.stats, self.source_stats
    return {"mixture": mixture, "batches": self.batches, "stats": dict(stats),
            "sources": [dict(s) for s in sources]}

  def restore(self, state: dict) -> None:
    self.mixture.restore(state["mixture"])
    self.batches = int(state["batches"])
    self.stats = {k: int(state["stats"].get(k, 0)) for k in STAT_KEYS}
    saved = state.get("sources")
    if saved and len(saved) == len(self.source_stats):  # older states have no per-source counts
      self.source_stats = [dict(new_source_stats(s["name"]), **s) for s in saved]
    self._reset_watch()
    self._pending = None

  def summary(self) -> dict:
    """Counts so far (JSON-able): the totals of `stats` and, per source, its rows, the rows skipped
    as malformed when it was loaded (with the first locations and reasons), and examples drawn / kept /
    truncated / dropped by reason."""
    out = {"batches": self.batches, **self.stats, "sources": []}
    for j, st in enumerate(self.source_stats):
      entry = dict(st)
      if self.sources:
        entry.update(rows=len(self.sources[j]), **self.sources[j].skip_report())
      out["sources"].append(entry)
    return out


def make_batch_iterator(mixture: Mixture, tokenizer, batch_size: int, max_length: int, *,
                        packing: bool = True, truncation: str = "right",
                        buckets: Sequence[int] | None = None, pad_id: int | None = None,
                        warn_dropped_share: float = 0.1) -> BatchIterator:
  """Batches of `batch_size` rows from `mixture` (see the module docstring and `fineflax.data`)."""
  return BatchIterator(mixture, tokenizer, batch_size, max_length, packing=packing,
                       truncation=truncation, buckets=buckets, pad_id=pad_id,
                       warn_dropped_share=warn_dropped_share)
