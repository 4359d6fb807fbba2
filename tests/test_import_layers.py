"""Imports only point down: no cycle between modules or between packages, and no import from a lower layer
to a higher one (README, "Package layers", quotes `LAYERS`).

Every `import` / `from ... import` statement of every module of fineflax/, retrieval/ and memory/ counts,
at module level and inside functions alike (an import inside a function hides a circle, it does not remove
it). `from P import x` is an edge to the module P.x when that is a module, else to P. Imports by name at run
time (`importlib.import_module`) are not seen.
"""
from __future__ import annotations

import pathlib
import re
import textwrap

import pytest

from fineflax.testing.imports import (find_cycles, import_graph, imports_of, layer_lines, layer_of,
                                      strongly_connected, upward_imports)

REPO = pathlib.Path(__file__).resolve().parents[1]
ROOTS = ("fineflax", "retrieval", "memory")

# Lowest first. A module may import modules of its own layer and of lower layers, never of a higher one.
# Units are dotted package or module names; a module belongs to the unit that is its longest prefix.
LAYERS = (
    ("base", "plain Python, no JAX",
     ("fineflax", "fineflax.io", "fineflax.config_checks", "fineflax.extras", "fineflax.runs", "fineflax.stats")),
    ("search", "NumPy / FAISS / bm25s; of fineflax only the base", ("retrieval", "memory")),
    ("kernels", "nothing about a model", ("fineflax.mesh", "fineflax.quant", "fineflax.rewards")),
    ("models", "config, HF / GGUF import, decoder, quantising the base", ("fineflax.models",)),
    ("model users", "adapters, decoding engine, train steps and loop, data",
     ("fineflax.lora", "fineflax.engine", "fineflax.train", "fineflax.data")),
    ("sampling", "generate, SamplerSession, chat formatting", ("fineflax.sampling",)),
    ("algorithms", "RL math and rollouts, Search-R1, evaluation, RAG variants",
     ("fineflax.rl", "fineflax.search_r1", "fineflax.evals", "fineflax.rag")),
    ("tasks", "RL environments, traced agents", ("fineflax.envs", "fineflax.agents")),
    ("jobs", "the launch.py jobs, config resolution", ("fineflax.jobs",)),
    ("entry points", "CLI errors, data inspection, the server",
     ("fineflax.cli", "fineflax.inspect_data", "fineflax.serve")),
    ("testing", "tiny models, servers and hostile programs shared by tests and benchmarks", ("fineflax.testing",)),
)
# Cycles between modules allowed for now, each with the issue that removes it.
ALLOWED_CYCLES: tuple[frozenset, ...] = ()
NO_JAX = ("jax", "flax", "optax", "orbax", "clu")  # the base layer imports none of these
SCRIPTS = ("benchmarks", "experiments", "tests", "configs", "launch")  # above every layer


# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph():
  return import_graph(REPO, ROOTS)


def test_every_module_has_a_layer(graph):
  modules, _ = graph
  find = layer_of(LAYERS)
  assert [m for m in modules if find(m) is None] == [], "add the package to LAYERS (and README)"


def test_no_cycle_between_modules(graph):
  _, edges = graph
  assert find_cycles(edges, allowed=ALLOWED_CYCLES) == []


def test_allowed_cycles_still_exist(graph):
  """An allow-listed cycle that is gone must leave ALLOWED_CYCLES (so the list only shrinks)."""
  _, edges = graph
  graph = {}
  for e in edges:
    graph.setdefault(e.src, []).append(e.dst)
  present = {frozenset(c) for c in strongly_connected(sorted(graph), graph)}
  assert [sorted(c) for c in ALLOWED_CYCLES if c not in present] == []


def test_no_cycle_between_packages(graph):
  _, edges = graph
  find = layer_of(LAYERS)
  assert find_cycles(edges, key=lambda m: find(m)[2]) == []


def test_no_import_from_a_lower_layer_to_a_higher_one(graph):
  _, edges = graph
  assert upward_imports(edges, LAYERS) == []


def test_retrieval_and_memory_import_only_the_base_of_fineflax(graph):
  """retrieval/ and memory/ speak NumPy and plain Python: no JAX training code (DESIGN.md)."""
  _, edges = graph
  find = layer_of(LAYERS)
  bad = [f"{e.path}:{e.line}: {e.src} imports {e.dst}" for e in edges
         if e.src.split(".")[0] in ("retrieval", "memory") and e.dst.startswith("fineflax")
         and find(e.dst)[1] != "base"]
  assert bad == []


def test_library_imports_no_script_folder(graph):
  """benchmarks/, experiments/, tests/, configs/ and launch.py sit above every layer: nothing here imports them."""
  modules, _ = graph
  bad = [(m, n) for m, f in modules.items() for n in imports_of(m, f, modules, REPO)[1] if n in SCRIPTS]
  assert bad == []


def test_benchmarks_import_no_experiment():
  """benchmarks/ sits below experiments/ (an experiment may reuse a benchmark's measurement, not the reverse):
  what both need lives in the library (e.g. fineflax/rag/kb.py, the RAG loop's knowledge base)."""
  import ast
  bad = []
  for path in sorted((REPO / "benchmarks").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
          [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
      bad += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "experiments"]
  assert bad == []


def test_base_layer_imports_no_jax(graph):
  modules, _ = graph
  find = layer_of(LAYERS)
  bad = [(m, n) for m, f in modules.items() if find(m)[1] == "base"
         for n in imports_of(m, f, modules, REPO)[1] if n in NO_JAX]
  assert bad == []


def test_readme_quotes_the_layer_table():
  readme = (REPO / "README.md").read_text()
  section = re.search(r"^### Package layers\n(.*?)(?=^#|\Z)", readme, re.S | re.M)
  assert section, "README.md has no '### Package layers' section"
  quoted = [line for line in section.group(1).splitlines() if re.match(r"\d+\. ", line)]
  assert quoted == layer_lines(LAYERS)


# The checker itself, on planted packages ----------------------------------------------------------
def _plant(tmp_path, files: dict[str, str]) -> pathlib.Path:
  for name, text in files.items():
    f = tmp_path / name
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(textwrap.dedent(text))
  return tmp_path


def test_checker_finds_a_cycle_hidden_in_a_function(tmp_path):
  parent = _plant(tmp_path, {
      "pkg/__init__.py": "",
      "pkg/a.py": "import os\nfrom pkg import b\n",
      "pkg/b.py": "def f():\n  from . import c\n  return c\n",
      "pkg/c.py": "def g():\n  import pkg.a\n",
      "pkg/d.py": "from pkg.a import b\n",  # d -> a, no cycle through d
  })
  _, edges = import_graph(parent, ["pkg"])
  messages = find_cycles(edges)
  assert messages == ["cycle pkg.a -> pkg.b -> pkg.c -> pkg.a (pkg/a.py:2 pkg.a imports pkg.b; "
                      "pkg/b.py:2 pkg.b imports pkg.c; pkg/c.py:2 pkg.c imports pkg.a)"]
  assert find_cycles(edges, allowed=(frozenset({"pkg.a", "pkg.b", "pkg.c"}),)) == []


def test_checker_finds_an_upward_import_and_a_package_cycle(tmp_path):
  parent = _plant(tmp_path, {
      "pkg/__init__.py": "",
      "pkg/low/__init__.py": "",
      "pkg/low/x.py": "def f():\n  import numpy\n  from pkg.high.y import g\n",
      "pkg/low/z.py": "",
      "pkg/high/__init__.py": "",
      "pkg/high/y.py": "from ..low import z\ng = 1\n",
  })
  modules, edges = import_graph(parent, ["pkg"])
  assert set(modules) == {"pkg", "pkg.low", "pkg.low.x", "pkg.low.z", "pkg.high", "pkg.high.y"}
  layers = (("low", "", ("pkg", "pkg.low")), ("high", "", ("pkg.high",)))
  assert upward_imports(edges, layers) == [
      "pkg/low/x.py:3: pkg.low.x (layer 1 low) imports pkg.high.y (layer 2 high, higher)"]
  assert find_cycles(edges) == []  # low.x -> high.y -> low.z: no module imports itself back
  find = layer_of(layers)
  assert find_cycles(edges, key=lambda m: find(m)[2]) == [  # but the packages low and high do
      "cycle pkg.high -> pkg.low -> pkg.high (pkg/high/y.py:1 pkg.high.y imports pkg.low.z; "
      "pkg/low/x.py:3 pkg.low.x imports pkg.high.y)"]
  one_layer = (("all", "", ("pkg", "pkg.low", "pkg.high")),)
  assert upward_imports(edges, one_layer) == []
