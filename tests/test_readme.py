"""The README's code runs as written: its Python blocks in order in one fresh interpreter (they build on
each other), and its `--dry_run` command lines. A block preceded by `<!-- readme-test: skip (why) -->`
is not run (the reason is in the README next to it)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"(<!-- readme-test: skip[^\n]*-->\n)?```(\w+)\n(.*?)```", re.S)


def _blocks(lang):
  text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
  return [(m.group(1) is None, m.group(3)) for m in BLOCK.finditer(text) if m.group(2) == lang]


def test_every_skipped_block_says_why():
  text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
  assert all(re.search(r"skip \(.{10,}\)", m) for m in re.findall(r"<!-- readme-test:[^\n]*-->", text))


@pytest.mark.slow
def test_python_blocks_run_in_order(tmp_path):
  code = "\n\n".join(src for run, src in _blocks("python") if run)
  assert "load(" in code and "quantize_params" in code and "create_search_engine" in code
  r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                     env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
  assert r.returncode == 0, r.stderr[-3000:]
  assert (tmp_path / "adapter" / "adapter_config.json").exists()


def test_dry_run_lines_run():
  lines = [ln for run, src in _blocks("bash") if run for ln in src.splitlines() if "--dry_run" in ln]
  assert lines
  for ln in lines:
    r = subprocess.run(ln, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (ln, r.stderr[-2000:])
