"""Imports only point down: no cycle between modules or between packages, and no import from a lower layer
to a higher one (README, "Package layers", quotes `LAYERS`).

Every `import` / `from ... import` statement of every module of fineflax/, retrieval/ and memory/ counts,
at module level and inside functions alike (an import inside a function hides a circle, it does not remove
it). `from P import x` is an edge to the module P.x when that is a module, else to P. Imports by name at run
time (`importlib.import_module`) are not seen.
"""
from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
import textwrap

import pytest

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
    ("algorithms", "RL math and rollouts, Search-R1, evaluation",
     ("fineflax.rl", "fineflax.search_r1", "fineflax.evals")),
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


@dataclasses.dataclass(frozen=True)
class Import:
  src: str    # importing module
  dst: str    # imported module (of the walked packages)
  path: str   # file of src, relative to the packages' parent folder
  line: int


def walk_modules(parent: pathlib.Path, roots) -> dict[str, pathlib.Path]:
  """{dotted module name: file} of every .py under parent/<root> (a package __init__ is the package)."""
  modules = {}
  for root in roots:
    for f in sorted((parent / root).rglob("*.py")):
      parts = list(f.relative_to(parent).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      modules[".".join(parts)] = f
  return modules


def _existing(name: str, modules) -> str | None:
  """The longest dotted prefix of `name` that is a walked module (None: a third-party import)."""
  while name and name not in modules:
    name = name.rpartition(".")[0]
  return name or None


def imports_of(module: str, path: pathlib.Path, modules, parent: pathlib.Path):
  """(Import of a walked module, every top-level name imported) of every import statement in `path`."""
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  found, names = [], []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
        base = ".".join(up + ([node.module] if node.module else []))
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    else:
      continue
    for t in targets:
      names.append(t.split(".")[0])
      dst = _existing(t, modules)
      edge = Import(module, dst, str(path.relative_to(parent)), node.lineno)
      if dst is not None and dst != module and edge not in found:
        found.append(edge)
  return found, names


def import_graph(parent: pathlib.Path, roots):
  """(modules, [Import]) of the packages `roots` under `parent`."""
  modules = walk_modules(parent, roots)
  edges = [e for m, f in modules.items() for e in imports_of(m, f, modules, parent)[0]]
  return modules, edges


def strongly_connected(nodes, edges: dict[str, list[str]]) -> list[set[str]]:
  """Tarjan's components of more than one node (iterative)."""
  index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
  for start in nodes:
    if start in index:
      continue
    work = [(start, iter(edges.get(start, ())))]
    index[start] = low[start] = counter[0]; counter[0] += 1; stack.append(start); on_stack.add(start)
    while work:
      v, it = work[-1]
      for w in it:
        if w not in index:
          index[w] = low[w] = counter[0]; counter[0] += 1; stack.append(w); on_stack.add(w)
          work.append((w, iter(edges.get(w, ()))))
          break
        if w in on_stack:
          low[v] = min(low[v], index[w])
      else:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
          comp = set()
          while True:
            w = stack.pop(); on_stack.discard(w); comp.add(w)
            if w == v:
              break
          if len(comp) > 1:
            out.append(comp)
  return out


def _one_cycle(comp: set[str], by_pair: dict[tuple[str, str], Import]) -> list[Import]:
  """The imports of one loop through the component `comp` (breadth-first from its smallest node)."""
  start = min(comp)
  prev, frontier = {start: None}, [start]  # node -> (previous node, the import between them)
  while frontier:
    nxt = []
    for v in frontier:
      for (a, b), e in sorted(by_pair.items()):
        if a != v or b not in comp:
          continue
        if b == start:
          loop = [e]
          while prev[v] is not None:
            v, step = prev[v]
            loop.append(step)
          return loop[::-1]
        if b not in prev:
          prev[b] = (v, e)
          nxt.append(b)
    frontier = nxt
  raise AssertionError(f"no loop through {comp}")


def find_cycles(edges, key=lambda m: m, allowed=()) -> list[str]:
  """One message a cycle between the nodes `key(module)` (modules, or packages with `key=unit`), naming
  each import of one loop with its file and line; components equal to an `allowed` set are skipped."""
  by_pair = {}
  for e in edges:
    a, b = key(e.src), key(e.dst)
    if a != b and (a, b) not in by_pair:
      by_pair[(a, b)] = e
  graph = {}
  for a, b in by_pair:
    graph.setdefault(a, []).append(b)
  messages = []
  for comp in strongly_connected(sorted(graph), graph):
    if frozenset(comp) in allowed:
      continue
    steps = _one_cycle(comp, by_pair)
    loop = " -> ".join(key(s.src) for s in steps) + f" -> {key(steps[0].src)}"
    where = "; ".join(f"{s.path}:{s.line} {s.src} imports {s.dst}" for s in steps)
    rest = sorted(comp - {key(s.src) for s in steps})
    messages.append(f"cycle {loop} ({where})" + (f"; the same component holds {', '.join(rest)}" if rest else ""))
  return messages


def layer_of(layers):
  """module -> (layer number, layer name, unit) by the unit that is the module's longest prefix; None when
  no unit holds it."""
  units = {u: (i, name) for i, (name, _, us) in enumerate(layers) for u in us}

  def find(module: str):
    name = module
    while name:
      if name in units:
        return (*units[name], name)
      name = name.rpartition(".")[0]
    return None
  return find


def upward_imports(edges, layers) -> list[str]:
  """One message an import from a lower layer to a higher one, naming the file, line and both layers."""
  find = layer_of(layers)
  out = []
  for e in edges:
    (i, a, _), (j, b, _) = find(e.src), find(e.dst)
    if j > i:
      out.append(f"{e.path}:{e.line}: {e.src} (layer {i + 1} {a}) imports {e.dst} (layer {j + 1} {b}, higher)")
  return out


def layer_lines(layers) -> list[str]:
  """The table as README quotes it: one line a layer, lowest first (fineflax's own units without the
  "fineflax." prefix; "fineflax" itself is its __init__)."""
  short = lambda u: "fineflax/__init__" if u == "fineflax" else u.removeprefix("fineflax.")
  return [f"{i + 1}. {name}: {', '.join(map(short, units))} ({what})" for i, (name, what, units) in enumerate(layers)]


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
