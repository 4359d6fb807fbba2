"""Code and text chunking on real standard-library files: lossless partition, one chunk per definition,
size limit, names and docstrings checked against Python's own `ast` / `inspect`."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import inspect
import json.decoder
import textwrap

import pytest

from memory.chunking import Chunk, chunk_code, chunk_file, chunk_markdown, chunk_plain, nonws

pytestmark = pytest.mark.fast

STDLIB = [json.decoder, textwrap, argparse, dataclasses, ast]


def ast_definitions(source: str) -> list[tuple[int, str]]:
  """(def line, dotted qualified name) of every function and class, nested ones included."""
  out = []

  def walk(node, scope):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        out.append((child.lineno, ".".join(scope + (child.name,))))
        walk(child, scope + (child.name,))
      else:
        walk(child, scope)
  walk(ast.parse(source), ())
  return sorted(out)


def check_partition(chunks: list[Chunk], source: str, max_chars: int) -> None:
  assert "".join(c.text for c in chunks) == source
  assert chunks[0].start_line == 1
  for a, b in zip(chunks, chunks[1:]):
    assert b.start_line == a.end_line + 1
  for c in chunks:
    assert c.text.count("\n") + (not c.text.endswith("\n")) == c.end_line - c.start_line + 1
    if nonws(c.text) > max_chars:  # only a single unsplittable line may exceed the limit
      assert sum(1 for line in c.text.splitlines() if line.strip()) == 1, (c.path, c.start_line)


@pytest.mark.parametrize("max_chars", [300, 1200])
@pytest.mark.parametrize("module", STDLIB, ids=lambda m: m.__name__)
def test_stdlib_files_partition_and_definitions(module, max_chars):
  path = inspect.getsourcefile(module)
  source = open(path, encoding="utf-8").read()
  chunks = chunk_code(source, path, max_chars=max_chars)
  check_partition(chunks, source, max_chars)
  reference = ast_definitions(source)
  listed = sorted((c.start_line, c.end_line, s) for c in chunks for s in c.symbols)
  assert sorted(s for *_, s in listed) == sorted(name for _, name in reference)
  for line, name in reference:  # each definition's header line lies in exactly the chunk listing it
    holders = [c for c in chunks if c.start_line <= line <= c.end_line]
    assert len(holders) == 1 and name in holders[0].symbols
  for c in chunks:
    assert c.kind in ("function", "class", "method", "imports", "docstring", "code")
    if c.kind == "method":
      assert all("." in n for n in c.name.split(", "))
    if c.kind in ("function", "class", "method"):
      assert c.name
  docs = [c for c in chunks if c.kind == "docstring"]
  assert [c.docstring for c in docs[:1]] == ([inspect.cleandoc(module.__doc__)] if module.__doc__ else [])


def test_docstrings_and_kinds_match_inspect():
  path = inspect.getsourcefile(textwrap)
  chunks = chunk_code(open(path).read(), path, max_chars=600)
  by_name = {c.name: c for c in chunks}
  assert by_name["dedent"].kind == "function"
  assert by_name["dedent"].docstring == inspect.getdoc(textwrap.dedent)
  methods = [c for c in chunks if c.kind == "method"]
  assert any(c.name == "TextWrapper._wrap_chunks" for c in methods)
  wrap = next(c for c in methods if c.name == "TextWrapper._wrap_chunks")
  assert wrap.docstring == inspect.getdoc(textwrap.TextWrapper._wrap_chunks)
  text = wrap.embedding_text()
  assert "method: TextWrapper._wrap_chunks" in text and path in text and text.endswith(wrap.text)
  assert any(c.kind == "imports" and "import re" in c.text for c in chunks)


def test_small_neighbours_merge_and_large_nodes_split():
  source = "def a():\n  return 1\n\ndef b():\n  return 2\n\n" + \
      "def big():\n" + "".join(f"  x{i} = {i} * {i}\n" for i in range(60)) + "  return x0\n"
  chunks = chunk_code(source, "m.py", max_chars=200)
  check_partition(chunks, source, 200)
  assert chunks[0].name == "a, b" and chunks[0].symbols == ("a", "b")
  big = [c for c in chunks if c.name == "big"]
  assert len(big) >= 3 and big[0].symbols == ("big",) and all(not c.symbols for c in big[1:])


def test_syntax_error_file_still_chunks():
  source = ("import os\n\ndef good(a):\n    '''Fine.'''\n    return a + 1\n\n"
            "def broken(x:\n    return x +\n\nclass K:\n    def m(self):\n        return 2\n")
  with pytest.raises(SyntaxError):
    ast.parse(source)
  chunks = chunk_code(source, "bad.py", max_chars=40)
  check_partition(chunks, source, 40)
  good = [c for c in chunks if c.name == "good"]
  assert good and good[0].kind == "function" and good[0].docstring == "Fine."


def test_one_giant_line_stands_alone():
  source = "x = [" + ", ".join(str(i) for i in range(400)) + "]\ny = 1\n"
  chunks = chunk_code(source, "g.py", max_chars=100)
  check_partition(chunks, source, 100)
  assert nonws(chunks[0].text) > 100 and chunks[0].end_line == 1


def test_markdown_sections_and_fences():
  md = ("Intro.\n\n# Title\n## Setup\nInstall it.\n\n```bash\n# not a heading\n\npip install x\n```\n\n"
        "Usage\n-----\n" + "".join(f"para {i} " * 8 + "\n\n" for i in range(12)))
  chunks = chunk_markdown(md, "r.md", max_chars=150, min_chars=20)
  check_partition(chunks, md, 150)
  names = [c.name for c in chunks]
  assert "Title > Setup" in names and "Title > Usage" in names
  assert not any("not a heading" in n for n in names)
  assert sum(n == "Title > Usage" for n in names) >= 3  # the long section is split into paragraphs
  plain = chunk_plain(md, "r.txt", max_chars=150)
  check_partition(plain, md, 150)
  assert all(c.kind == "text" for c in plain)


def test_chunk_file_dispatch_and_unknown_extension(tmp_path):
  (tmp_path / "a.py").write_text("def f():\n  pass\n")
  (tmp_path / "n.md").write_text("# H\ntext\n")
  (tmp_path / "x.unknownext").write_text("?")
  assert chunk_file(tmp_path / "a.py")[0].kind == "function"
  assert chunk_file(tmp_path / "n.md", display_path="docs/n.md")[0].path == "docs/n.md"
  with pytest.raises(ValueError, match=r"x\.unknownext.*\.unknownext"):
    chunk_file(tmp_path / "x.unknownext")


@pytest.mark.skipif(importlib.util.find_spec("tree_sitter_javascript") is None,
                    reason="tree-sitter-javascript not installed")
def test_javascript_when_grammar_installed():
  js = ("import x from 'y';\n/** Adds. */\nexport class A {\n  /** M. */\n  m(a) { return 1; }\n"
        "  n(b) {\n    const q = 2;\n    return q * b;\n  }\n}\nfunction f() {}\nconst g = (a) => a;\n")
  chunks = chunk_code(js, "a.js", "javascript", max_chars=40)
  check_partition(chunks, js, 40)
  symbols = [s for c in chunks for s in c.symbols]
  assert symbols == ["A", "A.m", "A.n", "f", "g"]
  assert next(c for c in chunks if c.name == "A").docstring == "Adds."


import difflib  # noqa: E402

import rank_bm25  # noqa: E402


def ast_spans(source: str) -> list[tuple[str, int, int, int]]:
  """(qualified name, first line incl. decorators, first body line, last line) of every def / class."""
  out = []

  def walk(node, scope):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        first = min([child.lineno] + [d.lineno for d in child.decorator_list])
        out.append((".".join(scope + (child.name,)), first, child.body[0].lineno, child.end_lineno))
        walk(child, scope + (child.name,))
      else:
        walk(child, scope)
  walk(ast.parse(source), ())
  return out


REAL = [difflib, rank_bm25, textwrap, argparse, json.decoder]


@pytest.mark.parametrize("max_chars", [300, 1200, 1600])
@pytest.mark.parametrize("module", REAL, ids=lambda m: m.__name__)
def test_fitting_definitions_stay_whole_and_headers_keep_their_body(module, max_chars):
  """A definition that fits the budget is in one chunk, whatever comments precede it (difflib's
  __chain_b with its 17-line comment block at 1600); an oversized one keeps its header line with the first
  line of its body (no header-only chunk such as `class TextWrapper:`)."""
  path = inspect.getsourcefile(module)
  source = open(path, encoding="utf-8").read()
  lines = source.splitlines(keepends=True)
  chunks = chunk_code(source, path, max_chars=max_chars)
  check_partition(chunks, source, max_chars)
  holder = lambda line: next(c for c in chunks if c.start_line <= line <= c.end_line)  # noqa: E731
  for name, first, body, last in ast_spans(source):
    c = holder(first)
    if nonws("".join(lines[first - 1:last])) <= max_chars:
      assert c.end_line >= last, (name, first, last, c.start_line, c.end_line)
    elif nonws("".join(lines[first - 1:body])) <= max_chars:
      assert c.end_line >= body, (name, first, body, c.start_line, c.end_line)


def test_difflib_chain_b_is_one_chunk_and_its_comment_block_another():
  path = inspect.getsourcefile(difflib)
  chunks = chunk_code(open(path, encoding="utf-8").read(), path, max_chars=1600)
  chain = [c for c in chunks if "def __chain_b(self):" in c.text]
  assert len(chain) == 1 and "del b2j[elt]" in chain[0].text.split("def find_longest_match")[0]
  assert chain[0].text.lstrip().startswith("def __chain_b") and chain[0].name == "SequenceMatcher.__chain_b"


def test_trailing_commented_out_code_is_not_glued_to_the_last_method():
  path = inspect.getsourcefile(rank_bm25)
  chunks = chunk_code(open(path, encoding="utf-8").read(), path, max_chars=1200)
  method = next(c for c in chunks if "def get_batch_scores" in c.text and "BM25Plus" in c.name)
  assert "return score.tolist()" in method.text and "# class BM25Adpt" not in method.text
  dead = [c for c in chunks if "# class BM25Adpt" in c.text or "#     def get_scores" in c.text]
  assert dead and all(c.kind == "code" and c.name == "" for c in dead)


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
@pytest.mark.parametrize("suffix", [".py", ".md", ".txt"])
def test_chunks_are_exact_slices_in_every_line_ending(tmp_path, newline, suffix):
  """Every chunk's text equals file_text[start:end] of the file as read from disk; CR-only and CRLF files
  chunk at the same lines as LF (no 13k-character single chunk, no translated line endings)."""
  base = open(inspect.getsourcefile(textwrap), encoding="utf-8").read()
  if suffix != ".py":
    base = "# Title\n\n" + "".join(f"## Part {i}\n\n" + "words " * 40 + "\n\n" for i in range(30))
  path = tmp_path / f"f{suffix}"
  path.write_bytes(base.replace("\n", newline).encode("utf-8"))
  text = path.read_bytes().decode("utf-8")
  chunks = chunk_file(path, max_chars=400)
  assert "".join(c.text for c in chunks) == text
  for c in chunks:
    assert c.text == text[c.start:c.end] and nonws(c.text) <= 400 or c.text.count(newline) <= 1
  lf = chunk_file(path, base, max_chars=400)
  assert [(c.start_line, c.end_line, c.name) for c in chunks] == [(c.start_line, c.end_line, c.name) for c in lf]
