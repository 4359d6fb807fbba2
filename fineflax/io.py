"""Small file helpers: atomic writes, JSON and JSON-lines reads whose errors name the file (and line).

Plain Python only (no JAX): `retrieval/` and `memory/` import it too."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile
from typing import Any, Callable, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[pathlib.Path]:
  """Yields a temporary sibling of `path` (its folder is created) for a writer that takes a file name;
  when the block succeeds the sibling is renamed over `path`, else removed: readers never see half a file,
  and a crash leaves the old one."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  os.close(fd)
  try:
    yield pathlib.Path(tmp)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> pathlib.Path:
  """Writes `data` to `path` through `atomic_path`."""
  with atomic_path(path) as tmp:
    tmp.write_bytes(data)
  return pathlib.Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> pathlib.Path:
  """Writes `text` (UTF-8) to `path` through `atomic_path`."""
  return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, value: Any, indent: int | None = 1) -> pathlib.Path:
  """Writes `json.dumps(value, indent=indent)` and a newline to `path` through `atomic_path`."""
  return atomic_write_text(path, json.dumps(value, indent=indent) + "\n")


def read_json(path: str | os.PathLike) -> Any:
  """The parsed JSON of `path`; invalid JSON raises ValueError naming the file and position."""
  path = pathlib.Path(path)
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: invalid JSON ({e})") from e


class JsonLineError(ValueError):
  """A JSON-lines record that is not a JSON object: `where` ("<file>:line <n>") and `reason`."""

  def __init__(self, where: str, reason: str):
    super().__init__(f"{where}: {reason}")
    self.where, self.reason = where, reason


def json_error(e: json.JSONDecodeError) -> str:
  """"Expecting value at column 5", "Invalid control character at column 50" (json's own message for some
  errors already ends with "at"), with the line when the text spans several."""
  where = f"line {e.lineno} column {e.colno}" if e.lineno > 1 else f"column {e.colno}"
  return f"{e.msg} {where}" if e.msg.endswith(" at") else f"{e.msg} at {where}"


def json_object(text: str | bytes, where: str) -> dict:
  """The JSON object in `text`; JsonLineError(where, "invalid JSON (...)" | "expected a JSON object, got
  list") otherwise."""
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise JsonLineError(where, f"invalid JSON ({json_error(e)})") from None
  if not isinstance(value, dict):
    raise JsonLineError(where, f"expected a JSON object, got {type(value).__name__}")
  return value


def json_lines(path: str | os.PathLike,
               on_error: Callable[[JsonLineError], None] | None = None) -> Iterator[tuple[int, dict]]:
  """(line number, object) of each non-blank line of a JSON-lines file (numbered from 1). A line that is
  not a JSON object raises JsonLineError naming "<path>:line <n>", or, with `on_error`, is passed to it
  and skipped."""
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        value = json_object(line.rstrip("\r\n"), f"{path}:line {n}")
      except JsonLineError as e:
        if on_error is None:
          raise
        on_error(e)
        continue
      yield n, value
