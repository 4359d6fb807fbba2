"""Markdown and plain-text chunking by headings and paragraphs, on whole lines.

Contract as for code: chunks partition the lines, each holds at most `max_chars` non-whitespace
characters unless it has one non-blank line. Markdown: one section per ATX (`# x`) or setext heading
(outside fenced code), named by its heading path "A > B"; a section holding only its heading (below
`min_chars`) is merged into the next; an oversized section is split into paragraphs (blank-line separated,
fenced blocks kept whole) packed greedily. Plain text: paragraphs packed greedily.
"""
from __future__ import annotations

import re

from memory.chunking.chunk import Chunk, LineSizes, offsets, pack_lines, split_lines

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t#]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def _blocks(lines: list[str], lo: int, hi: int) -> list[tuple[int, int]]:
  """Paragraph spans of rows lo..hi: a blank line ends a block, except inside a fence; blanks go to the next block."""
  blocks, start, fence = [], lo, None
  for row in range(lo, hi + 1):
    m = _FENCE.match(lines[row])
    if m and (fence is None or m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)):
      fence = None if fence else m.group(1)
    if fence is None and not lines[row].strip() and row > start and lines[row - 1].strip():
      blocks.append((start, row - 1))
      start = row
  blocks.append((start, hi))
  return blocks


def _pack(blocks: list[tuple[int, int]], size: LineSizes, max_chars: int) -> list[tuple[int, int]]:
  """Greedy merge of adjacent blocks up to max_chars; an oversized block is split by lines."""
  spans: list[tuple[int, int]] = []
  for lo, hi in blocks:
    parts = pack_lines(lo, hi, size, max_chars) if size(lo, hi) > max_chars else [(lo, hi)]
    for a, b in parts:
      if spans and size(spans[-1][0], b) <= max_chars:
        spans[-1] = (spans[-1][0], b)
      else:
        spans.append((a, b))
  return spans


def _headings(lines: list[str]) -> list[tuple[int, int, str]]:
  """(row, level, title) of every heading outside fenced code."""
  out, fence = [], None
  for row, line in enumerate(lines):
    m = _FENCE.match(line)
    if m and (fence is None or m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)):
      fence = None if fence else m.group(1)
      continue
    if fence is not None:
      continue
    atx = _ATX.match(line.rstrip("\r\n"))
    if atx:
      out.append((row, len(atx.group(1)), (atx.group(2) or "").strip()))
    elif row + 1 < len(lines) and line.strip() and not line.startswith((" " * 4, "\t")) \
        and _SETEXT.match(lines[row + 1].rstrip("\r\n")) and not (out and out[-1][0] == row - 1):
      out.append((row, 1 if lines[row + 1].strip()[0] == "=" else 2, line.strip()))
  return out


def chunk_markdown(text: str, path: str, max_chars: int = 1200, min_chars: int = 100) -> list[Chunk]:
  """Section chunks of a markdown file (kind "section", name = heading path)."""
  lines = split_lines(text)
  if not lines:
    return []
  size = LineSizes(lines)
  at = offsets(lines)
  heads = _headings(lines)
  starts = [0] + [row for row, _, _ in heads if row > 0]
  bounds = [(a, b - 1) for a, b in zip(starts, starts[1:] + [len(lines)])]
  stack: list[tuple[int, str]] = []
  named = []
  by_row = {row: (level, title) for row, level, title in heads}
  for lo, hi in bounds:
    if lo in by_row:
      level, title = by_row[lo]
      stack = [s for s in stack if s[0] < level] + [(level, title)]
    named.append([lo, hi, " > ".join(t for _, t in stack)])
  merged = []
  for sec in named:  # a heading-only section joins the next one
    if merged and size(merged[-1][0], merged[-1][1]) < min_chars and size(merged[-1][0], sec[1]) <= max_chars:
      merged[-1] = [merged[-1][0], sec[1], sec[2]]
    else:
      merged.append(sec)
  chunks = []
  for lo, hi, name in merged:
    blocks = _blocks(lines, lo, hi)
    if len(blocks) > 1 and lo in by_row and blocks[0] == (lo, lo):  # keep the heading with its text
      blocks[:2] = [(lo, blocks[1][1])]
    spans = [(lo, hi)] if size(lo, hi) <= max_chars else _pack(blocks, size, max_chars)
    chunks += [Chunk("".join(lines[a:b + 1]), "section", name, path, a + 1, b + 1, "markdown",
                     start=at[a], end=at[b + 1]) for a, b in spans]
  return chunks


def chunk_plain(text: str, path: str, max_chars: int = 1200) -> list[Chunk]:
  """Paragraph chunks of a plain-text file (kind "text")."""
  lines = split_lines(text)
  if not lines:
    return []
  size = LineSizes(lines)
  spans = _pack(_blocks(lines, 0, len(lines) - 1), size, max_chars)
  at = offsets(lines)
  return [Chunk("".join(lines[a:b + 1]), "text", "", path, a + 1, b + 1, "text", start=at[a], end=at[b + 1])
          for a, b in spans]
