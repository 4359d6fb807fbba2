"""Chunking of code (tree-sitter, split-then-merge) and documents (headings, paragraphs)."""
from __future__ import annotations

import pathlib

from memory.chunking import languages
from memory.chunking.chunk import Chunk, nonws
from memory.chunking.code import chunk_code
from memory.chunking.text import chunk_markdown, chunk_plain

MARKDOWN_EXTENSIONS = (".md", ".markdown")
TEXT_EXTENSIONS = (".txt", ".rst")


def supported_extensions() -> tuple[str, ...]:
  """File extensions chunk_file handles with the grammars installed now."""
  code = tuple(e for s in languages.available() for e in s.extensions)
  return code + MARKDOWN_EXTENSIONS + TEXT_EXTENSIONS


def chunk_file(path: str | pathlib.Path, text: str | None = None, max_chars: int = 1200,
               display_path: str | None = None) -> list[Chunk]:
  """Chunks of one file, dispatched on its extension; `display_path` is the path stored in the chunks."""
  path = pathlib.Path(path)
  if text is None:  # newline="": keep \r\n and \r as they are, so chunks are exact slices of the file
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
      text = f.read()
  shown = display_path or str(path)
  suffix = path.suffix.lower()
  spec = languages.spec_for_path(path)
  if spec is not None:
    return chunk_code(text, shown, spec.name, max_chars)
  if suffix in MARKDOWN_EXTENSIONS:
    return chunk_markdown(text, shown, max_chars)
  if suffix in TEXT_EXTENSIONS:
    return chunk_plain(text, shown, max_chars)
  raise ValueError(f"{path}: no chunker for extension {suffix!r} (supported: {', '.join(supported_extensions())})")


__all__ = ["Chunk", "chunk_code", "chunk_file", "chunk_markdown", "chunk_plain", "nonws", "supported_extensions"]
