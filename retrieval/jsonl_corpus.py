"""Random access to the records of a JSON-lines corpus through a byte-offset index, never loading it whole.

  corpus = JsonlCorpus("wiki-18.jsonl")     # first use: one pass writes wiki-18.jsonl.offsets.npy (+ .json)
  corpus[i] -> dict                         # record i = the i-th non-blank line (as `datasets` numbers rows,
                                            # so FAISS ids of Search-R1's index are these positions)
  len(corpus)

The offsets (int64, one per record, then the file size) are memory-mapped from `<corpus>.offsets.npy`,
reused while the corpus has the size and modification time recorded in `<corpus>.offsets.json`, and
rebuilt otherwise; when the corpus's folder is not writable they go under $XDG_CACHE_HOME/fineflax-retrieval.
Reads use os.pread (no shared file position), so threads may read at once.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib

import numpy as np

from fineflax.io import atomic_path, atomic_write_json, json_object

CHUNK = 64 << 20


def scan_offsets(path: pathlib.Path) -> np.ndarray:
  """int64 [records + 1]: the start of every non-blank line, then the file size. One pass finds the newlines
  (vectorised per chunk); a line that does not start with "{" is read again to see whether it is blank
  (nothing but whitespace), so a corpus of JSON objects costs one pass."""
  size, pos, found = path.stat().st_size, 0, []
  with open(path, "rb") as f:
    while chunk := f.read(CHUNK):
      found.append(np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10).astype(np.int64) + pos)
      pos += len(chunk)
  newlines = np.concatenate(found) if found else np.zeros(0, np.int64)
  starts = np.concatenate([[0], newlines + 1]).astype(np.int64)
  ends = np.concatenate([newlines, [size]]).astype(np.int64)
  first = np.full(len(starts), -1, np.int64)
  inside = starts < ends
  if size:
    first[inside] = np.memmap(path, np.uint8, mode="r")[starts[inside]]
  keep = first == ord("{")
  with open(path, "rb") as f:
    for i in np.flatnonzero(~keep & inside):
      f.seek(int(starts[i]))
      keep[i] = bool(f.read(int(ends[i] - starts[i])).strip())
  return np.concatenate([starts[keep], [size]]).astype(np.int64)


def _cache_paths(path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
  if os.access(path.parent, os.W_OK):
    base = path.with_name(path.name + ".offsets")
  else:
    folder = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "fineflax-retrieval"
    folder.mkdir(parents=True, exist_ok=True)
    base = folder / (hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16] + ".offsets")
  return base.with_suffix(".offsets.npy"), base.with_suffix(".offsets.json")


def load_offsets(path: pathlib.Path) -> np.ndarray:
  """The memory-mapped offsets of `path`, built (atomically) when missing or stale."""
  npy, meta = _cache_paths(path)
  st = path.stat()
  stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
  if npy.exists() and meta.exists():
    try:
      if json.loads(meta.read_text()) == stamp:
        return np.load(npy, mmap_mode="r")
    except (ValueError, OSError):
      pass
  offsets = scan_offsets(path)
  with atomic_path(npy) as tmp, open(tmp, "wb") as f:
    np.save(f, offsets)
  atomic_write_json(meta, stamp, indent=None)
  return np.load(npy, mmap_mode="r")


class JsonlCorpus:
  """Records of a JSON-lines file by position (module docstring)."""

  def __init__(self, path: str | os.PathLike):
    self.path = pathlib.Path(path).expanduser()
    if not self.path.is_file():
      raise FileNotFoundError(f"{self.path}: no such corpus file")
    self.offsets = load_offsets(self.path)
    self._fd = os.open(self.path, os.O_RDONLY)

  def __len__(self) -> int:
    return len(self.offsets) - 1

  def line(self, i: int) -> bytes:
    if not 0 <= i < len(self):
      raise IndexError(f"{self.path}: record {i} of {len(self)}")
    start, end = int(self.offsets[i]), int(self.offsets[i + 1])
    return os.pread(self._fd, end - start, start)

  def __getitem__(self, i: int) -> dict:
    return json_object(self.line(int(i)).rstrip(b"\r\n"), f"{self.path}: record {i} (byte {int(self.offsets[i])})")

  def close(self) -> None:
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None

  def __del__(self):
    try:
      self.close()
    except Exception:
      pass
