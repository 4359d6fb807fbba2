"""Syntax-aware code chunking (split-then-merge, as cAST, Zhang et al. 2025) on tree-sitter trees.

Contract: the chunks of a file partition its lines (concatenating chunk texts gives the file back), each
holds at most `max_chars` non-whitespace characters unless it has a single non-blank line. An oversized
node is split along its children (groups of children sharing lines stay together; rows between groups —
blank lines, comments — go to the following group, unless they alone make a group that fits overflow: then
they form their own chunk; non-blank rows after the file's last statement, such as commented-out code, are
never glued to the last definition; a node's header rows stay with its first child); adjacent pieces of the same definition, or whole
sibling definitions / import lines / other code of the same kind, are merged greedily up to `max_chars`.
Syntax errors only give ERROR nodes, which are split like any other node.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect

import tree_sitter

from memory.chunking import languages
from memory.chunking.chunk import Chunk, LineSizes, normalise_newlines, offsets, pack_lines, split_lines

_MAX_DEPTH = 200


@dataclasses.dataclass(frozen=True)
class _Label:
  kind: str                    # function | class | method | imports | docstring | code
  name: str                    # qualified name of the definition ("" for other code)
  scope: tuple[str, ...]       # qualified names of enclosing definitions
  scope_is_class: bool = False
  node_id: int | None = None   # id of the definition node this label belongs to
  node: tree_sitter.Node | None = None


@dataclasses.dataclass
class _Piece:
  lo: int
  hi: int
  label: _Label
  whole: bool                  # covers a whole definition (or other top-level unit)
  names: list[str] = dataclasses.field(default_factory=list)


def _last_row(node: tree_sitter.Node) -> int:
  end = node.end_point
  return end.row - 1 if end.column == 0 and end.row > node.start_point.row else end.row


class _Splitter:

  def __init__(self, spec: languages.LanguageSpec, size: LineSizes, max_chars: int):
    self.spec, self.size, self.max_chars = spec, size, max_chars

  def label_for(self, node: tree_sitter.Node, parent: _Label, top_level: bool, first: bool) -> tuple[_Label, bool]:
    """The label of a group made of `node` alone, and whether it starts a new unit."""
    inner = languages.unwrap(node, self.spec)
    kind = languages.definition_kind(inner, self.spec)
    if kind is not None and inner.id != parent.node_id:
      scope = parent.scope + ((parent.name,) if parent.node_id is not None else ())
      name = ".".join(scope + (languages.definition_name(inner),))
      if kind == "function" and parent.kind == "class" and parent.node_id is not None:
        kind = "method"
      return _Label(kind, name, scope, kind == "class", inner.id, inner), True
    if not top_level:
      return parent, False
    if node.type in self.spec.imports:
      return _Label("imports", "", ()), True
    if first and self.spec.python_docstrings and node.type == "expression_statement" and \
        node.named_child_count == 1 and node.named_children[0].type == "string":
      return _Label("docstring", "", ()), True
    return _Label("code", "", ()), True

  def content_last(self, node: tree_sitter.Node) -> int:
    """The last row of `node` that is not a trailing comment (closing tokens such as `}` count)."""
    kids = [k for k in node.children if k.type not in self.spec.comments]
    if not kids:
      return _last_row(node)
    return max(self.content_last(kids[-1]), kids[-1].start_point.row)

  def split(self, nodes: list[tree_sitter.Node], lo: int, hi: int, label: _Label, whole: bool,
            top_level: bool = False, depth: int = 0) -> list[_Piece]:
    """Pieces covering rows lo..hi, which hold the sibling `nodes` (all of them when top_level)."""
    if not top_level and (self.size(lo, hi) <= self.max_chars or lo == hi):
      return [_Piece(lo, hi, label, whole, [label.name] if whole and label.name else [])]
    kids = nodes if top_level else [k for n in nodes for k in n.named_children]
    kids = [k for k in kids if k.type not in self.spec.comments]
    if not kids or depth > _MAX_DEPTH:
      return [_Piece(a, b, label, False) for a, b in pack_lines(lo, hi, self.size, self.max_chars)]
    groups: list[list] = []  # [first_row, last_row, nodes]
    for kid in kids:
      first, last = kid.start_point.row, _last_row(kid)
      if groups and first <= groups[-1][1]:
        groups[-1][1] = max(groups[-1][1], last)
        groups[-1][2].append(kid)
      else:
        groups.append([first, last, [kid]])
    # The parent's own header rows (`class A:`, `class A {`) belong to its first group, so an oversized
    # definition's header is chunked with the first part of its body.
    body = nodes[0].child_by_field_name("body") if not top_level and len(nodes) == 1 else None
    pieces, start, carried = [], lo, False
    for i, (first, last, members) in enumerate(groups):
      if body is not None and last < body.start_point.row and i < len(groups) - 1:
        carried = True
        continue  # name, parameters, bases: rows carried into the group holding the body
      end = hi if i == len(groups) - 1 else min(max(last, start), hi)
      trailing = None
      if top_level and i == len(groups) - 1 and last < hi and self.size(last + 1, hi) > 0:
        end, trailing = last, (last + 1, hi)  # e.g. commented-out code after the last definition
      sub_label, new = label, False
      defs = [m for m in members if languages.definition_kind(languages.unwrap(m, self.spec), self.spec)]
      if len(members) == 1 or len(defs) == 1:
        sub_label, new = self.label_for(defs[0] if defs else members[0], label, top_level,
                                        first=(i == 0))
      elif top_level:
        sub_label, new = _Label("code", "", ()), True
      core = (first, min(max(self.content_last(m) for m in members), end))
      if (top_level or i > 0) and not carried and start <= first <= end and \
          self.size(start, end) > self.max_chars and self.size(*core) <= self.max_chars:
        # comments before or after a group that fits would make it overflow: they get their own chunk(s)
        lead = (start, core[0] - 1) if self.size(start, core[0] - 1) > 0 else None
        tail = (core[1] + 1, end) if core[1] < end and self.size(core[1] + 1, end) > 0 else None
        pieces += [_Piece(a, b, sub_label, False) for a, b in pack_lines(*lead, self.size, self.max_chars)] if lead else []
        pieces += self.split(members, core[0] if lead else start, core[1] if tail else end, sub_label, new,
                             depth=depth + 1)
        pieces += [_Piece(a, b, sub_label, False) for a, b in pack_lines(*tail, self.size, self.max_chars)] if tail else []
      else:
        pieces += self.split(members, start, end, sub_label, new, depth=depth + 1)
      carried = False
      if trailing is not None:
        pieces += [_Piece(a, b, _Label("code", "", ()), True)
                   for a, b in pack_lines(trailing[0], trailing[1], self.size, self.max_chars)]
        end = hi
      start = end + 1
      if start > hi:
        break
    return pieces

  def merge(self, pieces: list[_Piece]) -> list[_Piece]:
    """Greedy merge of adjacent pieces of one definition, or whole same-kind siblings, up to max_chars."""
    out: list[_Piece] = []
    for p in pieces:
      q = out[-1] if out else None
      if q is not None and q.label.kind == p.label.kind and q.label.kind != "docstring" \
          and self.size(q.lo, p.hi) <= self.max_chars and (
              (q.label.node_id is not None and q.label.node_id == p.label.node_id) or
              (q.whole and p.whole and q.label.scope == p.label.scope)):
        q.hi, q.whole = p.hi, q.whole and p.whole
        q.names += [n for n in p.names if n not in q.names]
      else:
        out.append(dataclasses.replace(p, names=list(p.names)))
    return out


def _definitions(root: tree_sitter.Node, spec: languages.LanguageSpec) -> list[tuple[int, str]]:
  """(header row, qualified name) of every definition in the tree, nested ones included."""
  query = languages.definitions_query(spec.name)
  nodes = [n for ns in tree_sitter.QueryCursor(query).captures(root).values() for n in ns]
  out = []
  for node in nodes:
    if languages.definition_kind(node, spec) is None:
      continue
    names, parent = [languages.definition_name(node)], node.parent
    while parent is not None:
      if parent.type not in spec.wrappers and languages.definition_kind(parent, spec) is not None:
        names.append(languages.definition_name(parent))
      parent = parent.parent
    out.append((node.start_point.row, ".".join(reversed(names))))
  return sorted(out)


def _docstring(node: tree_sitter.Node | None, spec: languages.LanguageSpec) -> str:
  """Python: the first string of the body; other languages: the comments right above the definition."""
  if node is None:
    return ""
  if spec.python_docstrings:
    body = node.child_by_field_name("body") if node.type != "expression_statement" else None
    first = (body.named_children[0] if body is not None and body.named_child_count else node)
    if first.type == "expression_statement" and first.named_child_count and first.named_children[0].type == "string":
      raw = first.named_children[0].text.decode("utf-8", "replace")
      try:
        value = ast.literal_eval(raw)
        return inspect.cleandoc(value) if isinstance(value, str) else ""
      except (ValueError, SyntaxError):
        return inspect.cleandoc(raw.strip("\"'rRbBuUfF"))
    return ""
  lines, outer = [], node.parent if node.parent is not None and node.parent.type in spec.wrappers else node
  prev, row = outer.prev_named_sibling, outer.start_point.row
  while prev is not None and prev.type in spec.comments and _last_row(prev) >= row - 1:
    lines.insert(0, prev.text.decode("utf-8", "replace"))
    prev, row = prev.prev_named_sibling, prev.start_point.row
  text = "\n".join(lines)
  for mark in ("/**", "*/", "///", "//!", "//", "/*"):
    text = text.replace(mark, "")
  return inspect.cleandoc("\n".join(line.strip().lstrip("*").strip() for line in text.splitlines()))


def chunk_code(source: str, path: str, language: str = "python", max_chars: int = 1200) -> list[Chunk]:
  """Typed chunks of one source file (see module docstring for the contract)."""
  parser = languages.parser_for(language)
  if parser is None:
    raise ValueError(f"{path}: no tree-sitter grammar installed for language {language!r}")
  spec = next(s for s in languages.SPECS if s.name == language)
  lines = split_lines(source)
  if not lines:
    return []
  size = LineSizes(lines)
  at = offsets(lines)
  tree = parser.parse(normalise_newlines(source).encode("utf-8"))  # rows = our lines for \r and \r\n too
  splitter = _Splitter(spec, size, max_chars)
  root = _Label("code", "", ())
  pieces = splitter.split(tree.root_node.named_children, 0, len(lines) - 1, root, True, top_level=True) \
      if tree.root_node.named_child_count else [_Piece(0, len(lines) - 1, root, True)]
  pieces = splitter.merge(pieces)
  defs = _definitions(tree.root_node, spec)
  chunks, d = [], 0
  for p in pieces:
    symbols = []
    while d < len(defs) and defs[d][0] <= p.hi:
      symbols.append(defs[d][1])
      d += 1
    node = p.label.node
    if p.label.kind == "docstring":
      node = next(n for n in tree.root_node.named_children if n.type not in spec.comments)
    chunks.append(Chunk(
        text="".join(lines[p.lo:p.hi + 1]), kind=p.label.kind,
        name=", ".join(p.names) if p.names else p.label.name, path=path,
        start_line=p.lo + 1, end_line=p.hi + 1, language=language,
        docstring=_docstring(node, spec), symbols=tuple(symbols), start=at[p.lo], end=at[p.hi + 1]))
  return chunks
