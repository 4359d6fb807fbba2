"""Documents and hits: the records that search engines take in and hand back."""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Iterable, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Document:
  id: str
  text: str
  title: str = ""
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def indexed_text(self) -> str:
    """What retrievers see: title + " " + text (BEIR convention), or text alone."""
    return f"{self.title} {self.text}" if self.title else self.text


@dataclasses.dataclass(frozen=True)
class Hit:
  id: str
  score: float
  text: str
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  title: str = ""


def hit(doc: Document, score: float) -> Hit:
  return Hit(doc.id, float(score), doc.text, doc.metadata, doc.title)


def to_documents(documents: Iterable[Mapping[str, Any] | str | Document], where: str = "documents",
                 lines: Sequence[int] | None = None) -> list[Document]:
  """Normalises dicts {id, text, title?, metadata?} (or Search-R1's {id, contents: '"Title"\\ntext'})
  and plain strings (id = position) to Documents; errors name the offending entry: `where[i]`, or
  `where:line` when `lines` gives each entry's 1-based line in the file `where`."""
  out: list[Document] = []
  seen: dict[str, int] = {}
  at = (lambda i: f"{where}[{i}]") if lines is None else (lambda i: f"{where}:{lines[i]}")
  for i, d in enumerate(documents):
    if isinstance(d, Document):
      doc = d
    elif isinstance(d, str):
      doc = Document(str(i), d)
    elif isinstance(d, Mapping):
      if "text" in d:
        text, title = d["text"], d.get("title") or ""
      elif "contents" in d:
        title, _, text = str(d["contents"]).partition("\n")
        title = title.strip().strip('"')
      else:
        raise ValueError(f"{at(i)}: no 'text' (or 'contents') field; keys {sorted(d)}")
      if not isinstance(text, str):
        raise TypeError(f"{at(i)}: text is {type(text).__name__}, expected str")
      doc = Document(str(d.get("id", i)), text, str(title), dict(d.get("metadata") or {}))
    else:
      raise TypeError(f"{at(i)}: entry is {type(d).__name__}; expected dict or str")
    if doc.id in seen:
      raise ValueError(f"{at(i)}: duplicate id {doc.id!r} (first at {at(seen[doc.id])})")
    seen[doc.id] = i
    out.append(doc)
  return out


def read_jsonl(path: str | pathlib.Path) -> list[Document]:
  """Documents from a JSON-lines file; errors name the file and line."""
  path = pathlib.Path(path)
  rows, lines = [], []
  with path.open() as f:
    for line_no, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        rows.append(json.loads(line))
        lines.append(line_no)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{line_no}: invalid JSON ({e.msg})") from None
  return to_documents(rows, where=str(path), lines=lines)
