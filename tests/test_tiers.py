"""The fast tier (`pytest -m "not slow"`: the tests marked `fast`, tests/conftest.py) reaches every module of
fineflax/, retrieval/ and memory/: each is imported, directly or through the modules it imports (`ast`,
imports inside functions included), by a test file that holds a fast test (or by tests/conftest.py, which
every test loads), or is run by one as `python -m MODULE`. PROGRAMS are files that run only as programs."""
from __future__ import annotations

import pathlib
import re

import pytest

from fineflax.testing.imports import import_graph, imports_of

pytestmark = pytest.mark.fast

REPO = pathlib.Path(__file__).resolve().parents[1]
ROOTS = ("fineflax", "retrieval", "memory")
FAST = re.compile(r"pytest\.mark\.fast\b")
PROGRAMS = {  # module: what runs it (it is never imported)
    "fineflax.rewards.code_harness": "rewards.code_reward reads it as the sandbox's main.py",
    "fineflax.data.samples.make_samples": "writes the bundled samples; test_data_sources runs it from its path",
    "fineflax.models.assets.make_tokenizers": "writes the bundled tokenizer assets, by hand",
}


def unreached(parent: pathlib.Path, roots, test_files) -> list[str]:
  """Modules of `roots` that no file of `test_files` holding a fast test reaches through imports."""
  modules, edges = import_graph(parent, roots)
  graph: dict[str, set[str]] = {}
  for e in edges:
    graph.setdefault(e.src, set()).add(e.dst)
  run_as_module = re.compile(r"""["']-m["'],\s*["']((?:%s)(?:\.\w+)*)["']""" % "|".join(roots))
  seen: set[str] = set()
  for f in test_files:
    text = f.read_text()
    if not (FAST.search(text) or f.name == "conftest.py"):
      continue
    todo = [e.dst for e in imports_of(f.stem, f, modules, parent)[0]]
    for m in run_as_module.findall(text):
      todo += [x for x in (m, m + ".__main__") if x in modules]
    while todo:
      m = todo.pop()
      if m not in seen:
        seen.add(m)
        todo.extend(graph.get(m, ()))
        while "." in m:  # importing a.b.c runs a/__init__ and a/b/__init__
          m = m.rpartition(".")[0]
          todo.append(m)
  return sorted(m for m in modules if m not in seen and not m.endswith("__main__"))


def test_the_fast_tier_reaches_every_module():
  missing = unreached(REPO, ROOTS, [REPO / "tests" / "conftest.py", *sorted((REPO / "tests").glob("test_*.py"))])
  assert [m for m in missing if m not in PROGRAMS] == [], "mark a test that imports these modules `fast` (or write one)"


def test_programs_are_never_imported():
  modules, edges = import_graph(REPO, ROOTS)
  assert set(PROGRAMS) <= set(modules)
  assert [(e.src, e.dst) for e in edges if e.dst in PROGRAMS] == []


def test_the_check_finds_a_module_only_slow_tests_import(tmp_path):
  files = {
      "pkg/__init__.py": "", "pkg/a.py": "def f():\n  from pkg import b\n", "pkg/b.py": "", "pkg/c.py": "",
      "pkg/d.py": "",
      "tests/test_fast.py": "import pytest\nfrom pkg import a\npytestmark = pytest.mark.fast\n",
      "tests/test_slow.py": "from pkg import c\n",
      "tests/test_cli.py": "import pytest\n\n@pytest.mark.fast\ndef test_x():\n  run(['-m', 'pkg.d'])\n",
  }
  for name, text in files.items():
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text(text)
  tests = sorted((tmp_path / "tests").glob("*.py"))
  assert unreached(tmp_path, ("pkg",), tests) == ["pkg.c"]  # b through a's function, d run as a module
