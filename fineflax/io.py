"""Small file helpers: atomic text writes, JSON reads whose errors name the file."""
from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any


def atomic_write_text(path: str | os.PathLike, text: str) -> pathlib.Path:
  """Writes `text` to a temporary sibling, then renames it over `path`: readers never see half a file."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise
  return path


def read_json(path: str | os.PathLike) -> Any:
  """The parsed JSON of `path`; invalid JSON raises ValueError naming the file and position."""
  path = pathlib.Path(path)
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: invalid JSON ({e})") from e
