"""The import graph of Python packages read with `ast` (no import is executed): modules, import edges with
file and line (imports inside functions count), cycles (Tarjan) and layer checks.

Used by tests/test_import_layers.py (no circles, nothing imports upward) and tests/test_tiers.py (the fast tier
reaches every module).
"""
from __future__ import annotations

import ast
import dataclasses
import pathlib


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
