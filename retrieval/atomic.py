"""Atomic folder writes and versioned metadata for saved indexes."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Iterator


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[pathlib.Path]:
  """Yields a temporary sibling folder; when the block succeeds it replaces `path` (else it is removed).

  An existing `path` is renamed aside first and deleted after, so readers see the old folder or the
  new one, never a half-written one.
  """
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp"))
  try:
    yield tmp
    old = None
    if path.exists():
      old = path.with_name(f".{path.name}.old.{os.getpid()}")
      os.replace(path, old)
    os.replace(tmp, path)
    if old is not None:
      shutil.rmtree(old, ignore_errors=True)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def read_meta(path: str | os.PathLike, fmt: int, what: str) -> dict:
  """meta.json of a saved `what` in folder `path`, checked for format version `fmt`."""
  meta_path = pathlib.Path(path) / "meta.json"
  if not meta_path.is_file():
    raise FileNotFoundError(f"{meta_path}: not a saved {what}")
  meta = json.loads(meta_path.read_text())
  if meta.get("format") != fmt:
    raise ValueError(f"{meta_path}: format {meta.get('format')!r}, expected {fmt}")
  return meta
