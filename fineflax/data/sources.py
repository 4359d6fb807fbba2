"""Sources: a dataset read through `datasets`, mapped row by row to canonical messages.

`load_source(spec)` accepts
  - a local file: .jsonl / .json (JSON lines or one array), .parquet, .csv;
  - "sample:NAME", a bundled sample file (`sample_file(NAME)`);
  - "tfds:NAME" or "tfds:NAME:SPLIT" (needs tensorflow-datasets);
  - a `datasets.Dataset`, or a list of row dicts (name "<memory>");
  - anything else: a hub dataset name passed to `datasets.load_dataset(spec, split=split)`.

Malformed rows (invalid JSON, wrong field count in CSV, a row that does not fit the schema) raise
`DataError("FILE:line N: reason")` with on_bad_row="error", or are skipped and counted with "skip"
(`Source.num_skipped`, first reasons in `Source.skipped`, `Source.skip_report()` as a dict); a source that
skipped rows says so once, as a logging warning naming the first locations, when it is loaded. JSON lines
are checked with `json.loads` line by line before `datasets` reads the file, so the error names the line;
CSV records are located with the `csv` module; JSON arrays, Parquet and hub rows are named by row index.
"""
from __future__ import annotations

import contextlib
import csv
import os
import pathlib
import tempfile
from typing import Any, Sequence

import logging

import numpy as np

from fineflax.data.schemas import SCHEMAS, RowError, detect_schema, missing_columns, to_messages
from fineflax.io import JsonLineError, json_lines

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
SAMPLES_DIR = pathlib.Path(__file__).parent / "samples"
MAX_REPORTED = 20
SHOWN = 5  # locations named in the console warning and skip_report()
_log = logging.getLogger("fineflax.data")


class DataError(ValueError):
  """A data problem; the message names the file, line or row, and the field at fault."""


def sample_file(name: str) -> pathlib.Path:
  """Path of a bundled sample dataset (see fineflax/data/samples/make_samples.py)."""
  path = SAMPLES_DIR / name
  if not path.exists():
    found = sorted(p.name for p in SAMPLES_DIR.iterdir() if p.suffix in FILE_FORMATS)
    raise FileNotFoundError(f"no bundled sample {name!r}; samples are {found}")
  return path


class Source:
  """Random access to the valid rows of one dataset as `{"messages": [...], "where": "FILE:line N"}`.

  dataset: the `datasets.Dataset`; rows: int64 indices of its valid rows; schema: the schema name;
  locate(i) -> "FILE:line N" / "FILE:row i" for dataset row i.
  """

  def __init__(self, name: str, dataset, schema: str, rows: np.ndarray, skipped: list[str],
               num_skipped: int, lines: Sequence[int] | None = None):
    self.name, self.dataset, self.schema, self.rows = name, dataset, schema, rows
    self.skipped, self.num_skipped, self._lines = skipped, num_skipped, lines

  def locate(self, row: int) -> str:
    if self._lines is not None:
      return f"{self.name}:line {self._lines[row]}"
    return f"{self.name}:row {row}"

  def __len__(self) -> int:
    return len(self.rows)

  def __getitem__(self, i: int) -> dict:
    row = int(self.rows[i])
    return {"messages": to_messages(self.dataset[row], self.schema), "where": self.locate(row)}

  def __repr__(self) -> str:
    return (f"Source({self.name!r}, schema={self.schema!r}, rows={len(self)}, "
            f"skipped={self.num_skipped})")

  def skip_report(self) -> dict:
    """{"skipped": number of malformed rows skipped, "skipped_first": ["FILE:line N: reason", ...]}."""
    return {"skipped": self.num_skipped, "skipped_first": self.skipped[:SHOWN]}


def _report_skipped(label: str, bad: "BadRows", kept: int) -> None:
  if bad.count:
    more = f" and {bad.count - SHOWN} more" if bad.count > SHOWN else ""
    _log.warning("%s: skipped %d malformed row(s) of %d (on_bad_row='skip'): %s%s; first: %s", label,
                 bad.count, bad.count + kept, ", ".join(w.rsplit(":", 1)[-1] for w in bad.where[:SHOWN]),
                 more, bad.reasons[0])


class BadRows:
  """Collects bad rows: raises at the first one (mode "error") or counts them (mode "skip")."""

  def __init__(self, mode: str):
    if mode not in ("error", "skip"):
      raise ValueError(f"on_bad_row={mode!r}; choose 'error' or 'skip'")
    self.mode, self.reasons, self.where, self.count = mode, [], [], 0

  def __call__(self, where: str, reason: str):
    if self.mode == "error":
      raise DataError(f"{where}: {reason}")
    self.count += 1
    if len(self.reasons) < MAX_REPORTED:
      self.reasons.append(f"{where}: {reason}")
      self.where.append(where)


@contextlib.contextmanager
def quiet_datasets():
  """No "Generating train split" progress bars from `datasets` while a source loads (restored after)."""
  import datasets
  was_disabled = datasets.are_progress_bars_disabled()
  datasets.disable_progress_bars()
  try:
    yield
  finally:
    if not was_disabled:
      datasets.enable_progress_bars()


def _resolve_schema(schema: str, columns, where: str) -> str:
  if schema == "auto":
    try:
      return detect_schema(columns)
    except RowError as e:
      raise DataError(f"{where}: {e}") from None
  missing = missing_columns(schema, columns)
  if missing:
    raise DataError(f"{where}: schema {schema!r} needs column(s) {missing}; "
                    f"the columns are {sorted(columns)}")
  return schema


def _scan_jsonl(path: pathlib.Path, schema: str, bad: BadRows):
  """(schema, line numbers of the valid rows, whether any line was rejected), checking every line."""
  lines, rejected = [], False

  def reject(e: JsonLineError) -> None:
    nonlocal rejected
    bad(e.where, e.reason)
    rejected = True

  for n, row in json_lines(path, on_error=reject):
    if schema == "auto":
      schema = _resolve_schema("auto", row.keys(), f"{path}:line {n}")
    try:
      to_messages(row, schema)
    except RowError as err:
      missing = missing_columns(schema, row.keys())
      reason = f"missing column(s) {missing} of schema {schema!r}" if missing else str(err)
      bad(f"{path}:line {n}", reason)
      rejected = True
      continue
    lines.append(n)
  return schema, lines, rejected


def _scan_csv(path: pathlib.Path, bad: BadRows):
  """(start line of each record, header, rejected) checking that every record has the header's fields."""
  starts, rejected = [], False
  with open(path, encoding="utf-8", newline="") as f:
    reader = csv.reader(f)
    try:
      header = next(reader)
    except StopIteration:
      raise DataError(f"{path}: empty file (no header row)") from None
    start = reader.line_num + 1
    for record in reader:
      if len(record) != len(header):
        bad(f"{path}:line {start}", f"expected {len(header)} fields {header}, got {len(record)}")
        rejected = True
      else:
        starts.append(start)
      start = reader.line_num + 1
  return starts, header, rejected


def _load_file(path: pathlib.Path, bad: BadRows, schema: str, split: str, **kwargs):
  """(dataset, schema, line numbers or None, prevalidated) for a local file."""
  import datasets
  fmt = FILE_FORMATS.get(path.suffix.lower())
  if fmt is None:
    raise DataError(f"{path}: unknown file type {path.suffix!r}; use one of {sorted(FILE_FORMATS)}")
  if not path.exists():
    raise FileNotFoundError(f"{path}: no such data file")
  if path.stat().st_size == 0:
    raise DataError(f"{path}: dataset is empty (0 bytes)")
  lines, read_path, tmp = None, path, None
  if fmt == "csv":  # every column as text, empty cells as "" (pandas would guess numbers and NaN)
    kwargs.setdefault("keep_default_na", False)
  if path.suffix.lower() == ".jsonl":
    schema, lines, rejected = _scan_jsonl(path, schema, bad)
    if not lines:
      raise DataError(f"{path}: dataset is empty (no valid rows; {bad.count} skipped)"
                      if bad.count else f"{path}: dataset is empty (no rows)")
    if rejected:  # datasets cannot skip lines: read a copy holding the valid ones
      keep = set(lines)
      tmp = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8")
      with open(path, encoding="utf-8") as f, tmp:
        tmp.writelines(t for n, t in enumerate(f, start=1) if n in keep)
      read_path = pathlib.Path(tmp.name)
  elif fmt == "csv":
    lines, header, rejected = _scan_csv(path, bad)
    kwargs.setdefault("features", datasets.Features({c: datasets.Value("string") for c in header}))
    if not lines:
      raise DataError(f"{path}: dataset is empty (no valid rows; {bad.count} skipped)"
                      if bad.count else f"{path}: dataset is empty (header only)")
    if rejected:
      keep, tmp = set(lines), tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False,
                                                          encoding="utf-8", newline="")
      with open(path, encoding="utf-8", newline="") as f, tmp:
        writer = csv.writer(tmp)
        reader = csv.reader(f)
        writer.writerow(next(reader))
        start = reader.line_num + 1
        for record in reader:
          if start in keep:
            writer.writerow(record)
          start = reader.line_num + 1
      read_path = pathlib.Path(tmp.name)
  try:
    with quiet_datasets():
      ds = datasets.load_dataset(fmt, data_files=str(read_path), split=split, **kwargs)
  except Exception as e:
    raise DataError(f"{path}: datasets could not read it as {fmt} ({type(e).__name__}: {e})") from e
  finally:
    if tmp is not None:
      os.unlink(tmp.name)
  if lines is not None and len(lines) != len(ds):
    lines = None  # the loader saw a different row count (e.g. blank CSV lines): name rows by index
  return ds, schema, lines, path.suffix.lower() == ".jsonl"


def _load_tfds(spec: str, split: str):
  try:
    import tensorflow_datasets as tfds
  except ImportError:
    raise ImportError(f"{spec}: tfds sources need tensorflow-datasets (and, for most builders, "
                      f"tensorflow): pip install tensorflow-datasets tensorflow") from None
  import datasets
  parts = spec.split(":")
  name, split = parts[1], (parts[2] if len(parts) > 2 else split)
  def decode(v):
    return v.decode("utf-8") if isinstance(v, bytes) else (v.tolist() if hasattr(v, "tolist") else v)
  rows = [{k: decode(v) for k, v in ex.items()} for ex in tfds.as_numpy(tfds.load(name, split=split))]
  return datasets.Dataset.from_list(rows)


def load_source(spec: Any, *, schema: str = "auto", on_bad_row: str = "error", split: str = "train",
                name: str | None = None, **load_kwargs) -> Source:
  """A `Source` over `spec` (see the module docstring). load_kwargs go to `datasets.load_dataset`."""
  import datasets
  if schema != "auto" and schema not in SCHEMAS:
    raise ValueError(f"schema={schema!r}; choose 'auto' or one of {list(SCHEMAS)}")
  bad = BadRows(on_bad_row)
  lines, prevalidated = None, False
  if isinstance(spec, str) and spec.startswith("sample:"):
    spec = sample_file(spec[len("sample:"):])
  if isinstance(spec, datasets.Dataset):
    ds, label = spec, name or "<dataset>"
  elif isinstance(spec, list):
    ds, label = datasets.Dataset.from_list(spec) if spec else None, name or "<memory>"
    if ds is None:
      raise DataError(f"{label}: dataset is empty (no rows)")
  elif isinstance(spec, (str, os.PathLike)) and str(spec).startswith("tfds:"):
    ds, label = _load_tfds(str(spec), split), name or str(spec)
  elif (isinstance(spec, os.PathLike) or pathlib.Path(str(spec)).suffix.lower() in FILE_FORMATS
        or pathlib.Path(str(spec)).is_file()):
    path = pathlib.Path(spec).expanduser()
    ds, schema, lines, prevalidated = _load_file(path, bad, schema, split, **load_kwargs)
    label = name or str(path)
  else:
    try:
      with quiet_datasets():
        ds = datasets.load_dataset(str(spec), split=split, **load_kwargs)
    except Exception as e:
      raise DataError(f"{spec}: not a local file ({'/'.join(FILE_FORMATS)}) and datasets.load_dataset "
                      f"failed ({type(e).__name__}: {e})") from e
    label = name or str(spec)
  if len(ds) == 0:
    raise DataError(f"{label}: dataset is empty (no rows)")
  schema = _resolve_schema(schema, ds.column_names, label)
  where = (lambda i: f"{label}:line {lines[i]}") if lines is not None else (lambda i: f"{label}:row {i}")
  if prevalidated:
    rows = np.arange(len(ds), dtype=np.int64)
  else:
    keep = []
    for i, row in enumerate(ds):
      try:
        to_messages(row, schema)
        keep.append(i)
      except RowError as e:
        bad(where(i), str(e))
    rows = np.asarray(keep, dtype=np.int64)
  if len(rows) == 0:
    raise DataError(f"{label}: dataset is empty (no valid rows; {bad.count} skipped)")
  _report_skipped(label, bad, len(rows))
  return Source(label, ds, schema, rows, bad.reasons, bad.count, lines)


def load_sources(spec: str, data_cfg) -> list[dict]:
  """`fineflax.data.build_mixture` entries with loaded sources from "path[:weight],..."; a bare name that is no
  file is a bundled sample ("sample:NAME")."""
  entries = []
  for item in [s.strip() for s in spec.split(",") if s.strip()]:
    path, weight = item, "1"
    if ":" in item and _is_number(item.rsplit(":", 1)[1]):
      path, weight = item.rsplit(":", 1)
    if not os.path.exists(path) and "/" not in path and not path.startswith("sample:"):
      path = "sample:" + path
    entries.append({"source": load_source(path, schema=data_cfg.schema, on_bad_row=data_cfg.on_bad_row),
                    "weight": float(weight)})
  if not entries:
    raise ValueError(f"config.data sources {spec!r} name no source")
  return entries


def _is_number(s: str) -> bool:
  try:
    float(s)
    return True
  except ValueError:
    return False
