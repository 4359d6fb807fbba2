"""Chunk: one contiguous span of whole lines of a file, with its type, names and an embedding text."""
from __future__ import annotations

import dataclasses
import re

KINDS = ("function", "class", "method", "imports", "docstring", "code", "section", "text")


@dataclasses.dataclass(frozen=True)
class Chunk:
  """Lines `start_line..end_line` (1-based, inclusive) of `path`; `text` is exactly those lines, line
  endings included as in the file (`text == file_text[start:end]`).

  kind: one of KINDS. name: the qualified name(s) the chunk is about ("Class.method"; several joined
  by ", " when small neighbours were merged; the heading path "A > B" for markdown). symbols: qualified
  names of every definition whose header line lies in this chunk (nested ones included).
  """
  text: str
  kind: str
  name: str
  path: str
  start_line: int
  end_line: int
  language: str
  docstring: str = ""
  symbols: tuple[str, ...] = ()
  start: int = 0               # character offsets: file_text[start:end] == text
  end: int = 0

  @property
  def id(self) -> str:
    return f"{self.path}:{self.start_line}-{self.end_line}"

  @property
  def description(self) -> str:
    """First paragraph of the docstring on one line, at most 200 characters."""
    first = self.docstring.strip().split("\n\n")[0]
    return " ".join(first.split())[:200]

  def embedding_text(self) -> str:
    """A context header (type, qualified name, description, file and lines) followed by the text."""
    head = [f"{self.language} {self.kind}" + (f": {self.name}" if self.name else "")]
    if self.description:
      head.append(f"description: {self.description}")
    head.append(f"file: {self.path} lines {self.start_line}-{self.end_line}")
    return "\n".join(head) + "\n\n" + self.text

  def metadata(self) -> dict:
    """Flat metadata for a vector store (str/int values only)."""
    return {"path": self.path, "kind": self.kind, "name": self.name, "language": self.language,
            "start_line": self.start_line, "end_line": self.end_line,
            "symbols": ",".join(self.symbols), "description": self.description}


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def split_lines(text: str) -> list[str]:
  """Lines ended by "\\n", "\\r\\n" or a lone "\\r", each keeping its ending; "".join gives text back."""
  return _LINE.findall(text)


def normalise_newlines(text: str) -> str:
  """text with every line ending as "\\n": same lines as split_lines (what tree-sitter counts rows by)."""
  return text.replace("\r\n", "\n").replace("\r", "\n")


def offsets(lines: list[str]) -> list[int]:
  """Character offset of the start of each line, plus the total length."""
  out = [0]
  for line in lines:
    out.append(out[-1] + len(line))
  return out


def nonws(text: str) -> int:
  """Number of non-whitespace characters: the size measure of chunks."""
  return len(text) - sum(text.count(c) for c in " \t\n\r\f\v")


class LineSizes:
  """Prefix sums of non-whitespace characters per line: size(lo, hi) for rows lo..hi in O(1)."""

  def __init__(self, lines: list[str]):
    self.prefix = [0]
    for line in lines:
      self.prefix.append(self.prefix[-1] + nonws(line))

  def __call__(self, lo: int, hi: int) -> int:
    return self.prefix[hi + 1] - self.prefix[lo]


def pack_lines(lo: int, hi: int, size: LineSizes, max_chars: int) -> list[tuple[int, int]]:
  """Greedy split of rows lo..hi into spans of at most max_chars (a single longer row stands alone)."""
  spans, start = [], lo
  for row in range(lo, hi + 1):
    if row > start and size(start, row) > max_chars:
      spans.append((start, row - 1))
      start = row
  spans.append((start, hi))
  return spans
