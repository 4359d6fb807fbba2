"""Tree-sitter grammars the code chunker knows: node types that define functions, classes and imports.

Python is required (tree-sitter-python); JavaScript, TypeScript, Go and Rust are used when their grammar
packages (tree-sitter-javascript, -typescript, -go, -rust) are installed and skipped otherwise.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import pathlib

import tree_sitter


@dataclasses.dataclass(frozen=True)
class LanguageSpec:
  """How one grammar spells definitions. `wrappers` hold a definition in field `wrapper_field`."""
  name: str
  extensions: tuple[str, ...]
  module: str
  loader: str
  functions: frozenset[str]
  classes: frozenset[str]
  imports: frozenset[str]
  comments: frozenset[str] = frozenset({"comment"})
  wrappers: frozenset[str] = frozenset()
  wrapper_field: str = "declaration"
  python_docstrings: bool = False


_JS_FUNCTIONS = frozenset({"function_declaration", "generator_function_declaration", "method_definition"})
_JS_CLASSES = frozenset({"class_declaration"})
_TS_CLASSES = _JS_CLASSES | {"abstract_class_declaration", "interface_declaration", "enum_declaration"}

SPECS = (
    LanguageSpec("python", (".py", ".pyi"), "tree_sitter_python", "language",
                 functions=frozenset({"function_definition"}), classes=frozenset({"class_definition"}),
                 imports=frozenset({"import_statement", "import_from_statement", "future_import_statement"}),
                 wrappers=frozenset({"decorated_definition"}), wrapper_field="definition",
                 python_docstrings=True),
    LanguageSpec("javascript", (".js", ".mjs", ".cjs", ".jsx"), "tree_sitter_javascript", "language",
                 functions=_JS_FUNCTIONS, classes=_JS_CLASSES, imports=frozenset({"import_statement"}),
                 wrappers=frozenset({"export_statement"})),
    LanguageSpec("typescript", (".ts", ".mts", ".cts"), "tree_sitter_typescript", "language_typescript",
                 functions=_JS_FUNCTIONS | {"function_signature"}, classes=_TS_CLASSES,
                 imports=frozenset({"import_statement"}), wrappers=frozenset({"export_statement"})),
    LanguageSpec("tsx", (".tsx",), "tree_sitter_typescript", "language_tsx",
                 functions=_JS_FUNCTIONS | {"function_signature"}, classes=_TS_CLASSES,
                 imports=frozenset({"import_statement"}), wrappers=frozenset({"export_statement"})),
    LanguageSpec("go", (".go",), "tree_sitter_go", "language",
                 functions=frozenset({"function_declaration", "method_declaration"}),
                 classes=frozenset({"type_declaration"}), imports=frozenset({"import_declaration"})),
    LanguageSpec("rust", (".rs",), "tree_sitter_rust", "language",
                 functions=frozenset({"function_item", "function_signature_item"}),
                 classes=frozenset({"struct_item", "enum_item", "trait_item", "impl_item", "mod_item"}),
                 imports=frozenset({"use_declaration"}),
                 comments=frozenset({"line_comment", "block_comment"})),
)


@functools.lru_cache(maxsize=None)
def parser_for(name: str) -> tree_sitter.Parser | None:
  """A parser for language `name`, or None when its grammar package is not installed."""
  spec = next(s for s in SPECS if s.name == name)
  try:
    module = importlib.import_module(spec.module)
  except ImportError:
    return None
  return tree_sitter.Parser(tree_sitter.Language(getattr(module, spec.loader)()))


def available() -> tuple[LanguageSpec, ...]:
  """Specs whose grammar is installed."""
  return tuple(s for s in SPECS if parser_for(s.name) is not None)


def spec_for_path(path: str | pathlib.Path) -> LanguageSpec | None:
  """The installed language of a file by extension, or None."""
  suffix = pathlib.Path(path).suffix.lower()
  return next((s for s in available() if suffix in s.extensions), None)


@functools.lru_cache(maxsize=None)
def definitions_query(name: str) -> tree_sitter.Query:
  """A query capturing every node whose type may define a function or class in language `name`."""
  spec = next(s for s in SPECS if s.name == name)
  language = parser_for(name).language
  types = sorted(spec.functions | spec.classes | {"lexical_declaration", "variable_declaration"})
  patterns = []
  for node_type in types:
    try:
      tree_sitter.Query(language, f"({node_type}) @d")
      patterns.append(f"({node_type}) @d")
    except (tree_sitter.QueryError, NameError, SyntaxError):
      continue  # node type absent from this grammar
  return tree_sitter.Query(language, "\n".join(patterns))


def definition_kind(node: tree_sitter.Node, spec: LanguageSpec) -> str | None:
  """"function" / "class" when `node` defines one (arrow functions bound by `const f = ...` included)."""
  if node.type in spec.functions:
    return "function"
  if node.type in spec.classes:
    return "class"
  if node.type in ("lexical_declaration", "variable_declaration") and node.named_child_count == 1:
    value = node.named_children[0].child_by_field_name("value")
    if value is not None and value.type in ("arrow_function", "function_expression", "function"):
      return "function"
  return None


def unwrap(node: tree_sitter.Node, spec: LanguageSpec) -> tree_sitter.Node:
  """The definition inside a wrapper (decorated_definition, export_statement), else node itself."""
  if node.type in spec.wrappers:
    inner = node.child_by_field_name(spec.wrapper_field)
    return inner if inner is not None else node
  return node


def definition_name(node: tree_sitter.Node) -> str:
  """The declared name; Go methods and Rust impls are named after their receiver / type."""
  if node.type in ("lexical_declaration", "variable_declaration"):
    node = node.named_children[0]
  if node.type == "type_declaration":  # Go: type T struct{...}
    spec = next((c for c in node.named_children if c.type in ("type_spec", "type_alias")), None)
    node = spec if spec is not None else node
  name = node.child_by_field_name("name")
  if node.type == "impl_item":  # Rust: impl Trait for Type / impl Type
    name = node.child_by_field_name("type")
  text = name.text.decode("utf-8", "replace") if name is not None else "<anonymous>"
  receiver = node.child_by_field_name("receiver") if node.type == "method_declaration" else None
  if receiver is not None:  # Go: func (t *T) M() -> T.M
    rtype = receiver.text.decode("utf-8", "replace").strip("()").split()[-1].lstrip("*")
    text = f"{rtype.split('[')[0]}.{text}"
  return text
