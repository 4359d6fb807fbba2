"""Writes one benchmark's section of benchmarks/RESULTS.md, leaving the other sections untouched, and its own
DIR/NAME.json and DIR/NAME.md (`publish`)."""
from __future__ import annotations

import pathlib
import re

from fineflax.io import atomic_write_json, atomic_write_text

RESULTS = pathlib.Path(__file__).with_name("RESULTS.md")
_HEADER = "# Benchmark results\n\nEach section is written by the script it names; numbers name their device.\n"


def write_section(name: str, markdown: str, path: pathlib.Path = RESULTS, header: str = _HEADER) -> None:
  """Replaces (or appends) the block between `<!-- name:start -->` and `<!-- name:end -->` atomically;
  a new file starts with `header`."""
  text = path.read_text() if path.exists() else header
  block = f"<!-- {name}:start -->\n{markdown.strip()}\n<!-- {name}:end -->"
  pattern = re.compile(rf"<!-- {re.escape(name)}:start -->.*?<!-- {re.escape(name)}:end -->", re.S)
  text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
  atomic_write_text(path, text)


def markdown_table(header: list[str], rows: list[list]) -> str:
  """A GitHub markdown table; floats printed with 3 significant digits."""
  fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
  return "\n".join(lines)


def publish(out: pathlib.Path, name: str, data: dict, md: str, section: tuple[str, str] | None = None) -> None:
  """Writes out/name.json (data) and out/name.md (md) atomically and prints md; section = (key, heading): also
  RESULTS.md's section `key`, the heading above md."""
  atomic_write_json(out / f"{name}.json", data, indent=2)
  atomic_write_text(out / f"{name}.md", md)
  print(md)
  if section is not None:
    write_section(section[0], f"{section[1]}\n\n{md}")
