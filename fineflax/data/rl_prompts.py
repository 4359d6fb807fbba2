"""RL prompt datasets: rows of parquet / JSONL files (or a hub dataset) mapped by a field map to prompts with
their ground truth, data source, optional off-policy trace and extra reward fields.

  fm = field_map("luffy")                                   # or FieldMap(question="q", ground_truth="a", ...)
  rows = load_prompts("openr1.parquet", fm, on_bad_row="skip")  # random access, Arrow memory-mapped
  rows[0] -> PromptRow(messages=[...], ground_truth="204", data_source="aime", target="<think>...", ...)
  stream = load_prompts("big.jsonl", fm, streaming=True)    # read in order, never converted or held whole

Field maps and the mapping of one row live in `fineflax.data.prompt_rows` (re-exported here).
Built-in maps (`FORMATS`), one per public format:
  luffy      LUFFY's openr1.parquet / valid.parquet: `prompt` (chat messages), `reward_model.ground_truth`,
             `data_source`, `target` (the trace: messages or a string; absent in evaluation files)
  search_r1  Search-R1's nq_hotpotqa_train / test parquets: `prompt` (their template around the question, as
             their trainer reads it), `question`, `golden_answers` (list), `data_source`
  gsm8k      GSM8K: `question`, `answer` ("... #### 72" -> "72"), source "openai/gsm8k"
  math       MATH (Hendrycks): `problem`, `solution` (its last \\boxed{} content), source "lighteval/MATH"
Field paths are dotted ("reward_model.ground_truth"). A row that cannot be used (a missing or empty prompt,
ground truth or data source, a malformed message or trace) raises `DataError("FILE:row N: field F: why")`
with on_bad_row="error", or is skipped, counted (`num_skipped`) and named (`skipped`, a warning) with
"skip". A row whose trace field is null simply has no trace (`num_without_target`).

Map-style sets read through `datasets` (Arrow files on disk, memory-mapped: larger than memory is fine).
Streaming sets (`streaming=True`) read the file in order through `datasets`' IterableDataset, once to check
and count the rows, then per epoch e through a shuffle buffer (`buffer_shuffle`, generator seeded by
[seed, e]); index k of a streaming set is row k % n of epoch k // n (forward reads are cheap; reading
backwards restarts the epoch).
"""
from __future__ import annotations

import glob
import logging
import pathlib
from typing import Sequence

import numpy as np

from fineflax.data.prompt_rows import FORMATS, FieldMap, PromptRow, field_map, map_row  # noqa: F401 (re-exported)
from fineflax.data.schemas import RowError
from fineflax.data.sources import SHOWN, BadRows, DataError, quiet_datasets, sample_file
from fineflax.io import JsonLineError, json_lines

FILE_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
_log = logging.getLogger("fineflax.data")


def resolve_files(spec: str) -> list[pathlib.Path] | None:
  """Local files of `spec` (a path, a glob, "sample:NAME" for a shipped sample, or several joined by commas),
  in order; None when spec names no local file type (a hub dataset). FileNotFoundError / DataError name the
  part at fault."""
  parts = [p.strip() for p in str(spec).split(",") if p.strip()]
  if not parts:
    raise DataError("no dataset given (an empty path)")
  parts = [str(sample_file(p[len("sample:"):])) if p.startswith("sample:") else p for p in parts]
  local = [p for p in parts if pathlib.Path(p).suffix.lower() in FILE_FORMATS or any(c in p for c in "*?[")
           or pathlib.Path(p).expanduser().exists()]
  if not local:
    return None
  files = []
  for p in parts:
    matches = sorted(glob.glob(str(pathlib.Path(p).expanduser()))) if any(c in p for c in "*?[") else [p]
    if not matches:
      raise FileNotFoundError(f"{p}: no file matches")
    for m in matches:
      path = pathlib.Path(m).expanduser()
      if path.suffix.lower() not in FILE_FORMATS:
        raise DataError(f"{path}: unknown file type {path.suffix!r}; use one of {sorted(FILE_FORMATS)}")
      if not path.is_file():
        raise FileNotFoundError(f"{path}: no such data file")
      files.append(path)
  formats = {FILE_FORMATS[f.suffix.lower()] for f in files}
  if len(formats) > 1:
    raise DataError(f"{spec}: mixes file types {sorted(formats)}; give files of one type")
  return files


def first_row(path: pathlib.Path) -> tuple[list[str], dict | None, str]:
  """(top-level columns, first row, "FILE:row 0" / "FILE:line N") of a file, reading its schema and first row."""
  if path.suffix.lower() == ".parquet":
    import pyarrow.parquet as pq
    pf = pq.ParquetFile(path)
    names = [n for n in pf.schema_arrow.names if n != "__index_level_0__"]
    for batch in pf.iter_batches(batch_size=1):
      return names, batch.to_pylist()[0], f"{path}:row 0"
    return names, None, str(path)
  for n, row in json_objects(path):
    return sorted(row), row, f"{path}:line {n}"
  return [], None, str(path)


def check_files(spec: str, fm: FieldMap) -> None:
  """Quick check before any weights load: every local file has the map's columns and its first row maps.
  DataError names the file, the row and the field. Hub datasets are checked when they load."""
  for path in resolve_files(spec) or ():
    columns, row, where = first_row(path)
    if row is None:
      raise DataError(f"{path}: dataset is empty (no rows)")
    missing = [c for c in fm.columns() if c not in columns and c != fm.target.split(".")[0]]
    if missing:
      raise DataError(f"{path}: no column(s) {missing} for the field map; the columns are {columns}")
    try:
      map_row(row, fm)
    except RowError as e:
      raise DataError(f"{where}: {e}") from None


def _jsonl_lines(path: pathlib.Path, rows: Sequence[int]) -> dict[int, int]:
  """{row index: 1-based line} for the given rows of a JSON-lines file (blank lines hold no row)."""
  want, out, i = set(rows), {}, 0
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, start=1):
      if line.strip():
        if i in want:
          out[i] = n
        i += 1
  return out


def _load_one(path: pathlib.Path | str, *, streaming: bool, split: str = "train", hub: bool = False):
  import datasets
  try:
    with quiet_datasets():
      if hub:
        return datasets.load_dataset(str(path), split=split, streaming=streaming)
      return datasets.load_dataset(FILE_FORMATS[path.suffix.lower()], data_files=str(path), split="train",
                                   streaming=streaming)
  except Exception as e:
    if not hub and path.suffix.lower() == ".jsonl":
      for _ in json_objects(path):  # raises DataError naming the line when that is the cause
        pass
    what = "hub dataset" if hub else FILE_FORMATS[pathlib.Path(path).suffix.lower()]
    raise DataError(f"{path}: datasets could not read it as {what} ({type(e).__name__}: {str(e)[:200]})") from e


def json_objects(path: pathlib.Path):
  """`fineflax.io.json_lines` of `path`, the first line that is not a JSON object raising DataError."""
  try:
    yield from json_lines(path)
  except JsonLineError as e:
    raise DataError(str(e)) from None


class _Part:
  """One file (or hub dataset) of a set: its label, dataset, valid row indices and how to name rows."""

  def __init__(self, label: str, path: pathlib.Path | None, dataset, rows: np.ndarray):
    self.label, self.path, self.dataset, self.rows = label, path, dataset, rows


def _scan(rows_iter, fm: FieldMap, bad: BadRows, label: str, path: pathlib.Path | None) -> tuple[np.ndarray, int]:
  """(valid row indices, rows without a trace) of one part, reporting bad rows to `bad`."""
  keep, no_target, failures = [], 0, []
  for i, raw in enumerate(rows_iter):
    try:
      row = map_row(raw, fm)
    except RowError as e:
      failures.append((i, str(e)))
      if bad.mode == "error":
        break
      continue
    keep.append(i)
    no_target += fm.target != "" and row.target is None
  if failures:
    lines = (_jsonl_lines(path, [i for i, _ in failures[:SHOWN * 4]])
             if path is not None and path.suffix.lower() == ".jsonl" else {})
    for i, reason in failures:
      bad(f"{label}:line {lines[i]}" if i in lines else f"{label}:row {i}", reason)
  return np.asarray(keep, np.int64), no_target


class PromptSet:
  """Random access to the valid rows of one or more files (map-style, Arrow memory-mapped)."""

  streaming = False

  def __init__(self, parts: list[_Part], fm: FieldMap, bad: BadRows, num_without_target: int):
    self.parts, self.fm = parts, fm
    self.num_skipped, self.skipped = bad.count, bad.reasons
    self.num_without_target = num_without_target
    self._ends = np.cumsum([len(p.rows) for p in parts])

  def __len__(self) -> int:
    return int(self._ends[-1]) if len(self._ends) else 0

  def __getitem__(self, i: int) -> PromptRow:
    i = int(i)
    if not 0 <= i < len(self):
      raise IndexError(f"row {i} of {len(self)}")
    p = int(np.searchsorted(self._ends, i, side="right"))
    part = self.parts[p]
    j = int(part.rows[i - (int(self._ends[p - 1]) if p else 0)])
    row = map_row(part.dataset[j], self.fm)
    row.where = f"{part.label}:row {j}"
    return row

  def __iter__(self):
    return (self[i] for i in range(len(self)))

  def report(self) -> dict:
    """{"rows", "skipped", "skipped_first", "without_target"}."""
    return {"rows": len(self), "skipped": self.num_skipped, "skipped_first": self.skipped[:SHOWN],
            "without_target": self.num_without_target}


def buffer_shuffle(items, buffer_size: int, rng: np.random.Generator):
  """A shuffled stream in O(buffer_size) memory: fill a buffer, then for each further item yield a random
  buffered one and put the item in its place; finally yield the rest in random order."""
  buffer = []
  for item in items:
    if len(buffer) < buffer_size:
      buffer.append(item)
      continue
    j = int(rng.integers(buffer_size))
    yield buffer[j]
    buffer[j] = item
  for j in rng.permutation(len(buffer)):
    yield buffer[j]


class StreamingPromptSet(PromptSet):
  """Rows read in order (`datasets` streaming); index k is row k % n of epoch k // n (module docstring)."""

  streaming = True

  def __init__(self, parts, fm, bad, num_without_target, *, seed: int = 0, buffer_size: int = 1000):
    super().__init__(parts, fm, bad, num_without_target)
    self.seed, self.buffer_size = int(seed), int(buffer_size)
    self._epoch, self._pos, self._iter, self._last = -1, 0, None, None

  def _stream(self, epoch: int):
    rows = (raw for part in self.parts for raw in part.dataset)
    label = self.parts[0].label if len(self.parts) == 1 else "streamed rows"
    for raw in buffer_shuffle(rows, self.buffer_size, np.random.default_rng([self.seed, epoch])):
      try:
        row = map_row(raw, self.fm)
      except RowError:
        continue  # counted and named when the set was loaded
      row.where = f"{label} (epoch {epoch})"
      yield row

  def __getitem__(self, k: int) -> PromptRow:
    k = int(k)
    if k < 0:
      raise IndexError(f"row {k}: streaming sets take indices >= 0")
    epoch, pos = divmod(k, len(self))
    if self._last is not None and (epoch, pos) == (self._epoch, self._pos - 1):
      return self._last
    if epoch != self._epoch or pos < self._pos:  # another epoch, or backwards: restart that epoch
      self._epoch, self._pos, self._iter = epoch, 0, self._stream(epoch)
    while self._pos <= pos:
      self._last = next(self._iter)
      self._pos += 1
    return self._last


def load_prompts(spec: str, fm: FieldMap, *, on_bad_row: str = "error", streaming: bool = False,
                 split: str = "train", seed: int = 0, buffer_size: int = 1000) -> PromptSet:
  """The PromptSet (or StreamingPromptSet) of `spec`: local files (`resolve_files`) or a hub dataset name.
  Every row is checked once here (module docstring); an empty result is a DataError."""
  bad = BadRows(on_bad_row)
  files = resolve_files(spec)
  sources = [(str(f), f, _load_one(f, streaming=streaming)) for f in files] if files is not None else \
      [(f"{spec}[{split}]", None, _load_one(spec, streaming=streaming, split=split, hub=True))]
  parts, no_target = [], 0
  for label, path, ds in sources:
    if not streaming:
      missing = [c for c in fm.columns() if c not in ds.column_names and c != fm.target.split(".")[0]]
      if missing:
        raise DataError(f"{label}: no column(s) {missing} for the field map; the columns are {ds.column_names}")
    rows, nt = _scan(iter(ds), fm, bad, label, path)
    no_target += nt
    parts.append(_Part(label, path, ds, rows))
  total = sum(len(p.rows) for p in parts)
  if total == 0:
    raise DataError(f"{spec}: no usable rows ({bad.count} skipped; first: {bad.reasons[:1]})"
                    if bad.count else f"{spec}: dataset is empty (no rows)")
  if bad.count:
    more = f" and {bad.count - SHOWN} more" if bad.count > SHOWN else ""
    _log.warning("%s: skipped %d unusable row(s) of %d (on_bad_row='skip'): %s%s", spec, bad.count,
                 bad.count + total, "; ".join(bad.reasons[:SHOWN]), more)
  if streaming:
    return StreamingPromptSet(parts, fm, bad, no_target, seed=seed, buffer_size=buffer_size)
  return PromptSet(parts, fm, bad, no_target)
