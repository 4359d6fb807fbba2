"""Where experiments write (issue 52: `experiments.adaptation_loop.run --reference-eval` wrote into the repository
by default and deleted 8 committed files): every experiment's output folder defaults to a path under runs/
(gitignored), and a folder holding files tracked by git is refused, in one line, unless --overwrite is given."""
import ast
import os
import pathlib
import subprocess
import sys

import pytest

from fineflax.runs import TrackedOutput, add_output_args, output_folder, tracked_files

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUTPUT_FLAGS = ("--out", "--out-dir", "--workdir")  # (--results and --work are inputs, but of reranker and heldout)


def _output_defaults(path: pathlib.Path) -> list[tuple[str, object]]:
  """(flag, default) of each add_argument of an output flag in a script, and ("add_output_args", name) calls."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if not isinstance(node, ast.Call):
      continue
    name = getattr(node.func, "attr", getattr(node.func, "id", ""))
    if name == "add_output_args":
      found.append(("add_output_args", ast.literal_eval(node.args[1])))
    elif name == "add_argument" and node.args and isinstance(node.args[0], ast.Constant) \
        and node.args[0].value in OUTPUT_FLAGS:
      kw = {k.arg: k.value for k in node.keywords}
      required = "required" in kw and ast.literal_eval(kw["required"])
      default = ast.unparse(kw["default"]) if "default" in kw else None
      found.append((node.args[0].value, "required" if required else default))
  return found


@pytest.mark.fast
def test_every_experiment_output_default_is_under_runs():
  import argparse
  ap = argparse.ArgumentParser()
  add_output_args(ap, "x")
  assert ap.parse_args([]).out == os.path.join("runs", "experiments", "x")
  scripts = {p: _output_defaults(p) for p in sorted(ROOT.glob("experiments/**/*.py"))}
  scripts = {p: f for p, f in scripts.items() if f}
  assert len(scripts) >= 10, scripts
  bad = {}
  for path, flags in scripts.items():
    for flag, default in flags:
      ok = flag == "add_output_args" or default in ("required", "''", '""') or \
          (default is not None and default.strip("'\"").startswith("runs/"))
      if not ok:
        bad[str(path.relative_to(ROOT))] = (flag, default)
  assert bad == {}, "an experiment's output default outside runs/"
  assert "/runs/" in (ROOT / ".gitignore").read_text() or "\n/runs/" in "\n" + (ROOT / ".gitignore").read_text()


@pytest.mark.fast
def test_a_folder_of_committed_files_is_refused_without_overwrite(tmp_path):
  committed = ROOT / "experiments" / "adaptation_loop"
  tracked = tracked_files(committed)
  assert "experiments/adaptation_loop/RESULTS.md" in tracked
  with pytest.raises(TrackedOutput, match=r"^--out .*adaptation_loop: holds \d+ file\(s\) tracked by git .* "
                                         r"pass --overwrite"):
    output_folder(committed, overwrite=False)
  assert output_folder(committed, overwrite=True) == str(committed)
  assert output_folder(tmp_path / "new" / "run", overwrite=False) == str(tmp_path / "new" / "run")
  assert tracked_files(ROOT / "runs" / "experiments" / "never") == []  # gitignored, not yet made


def test_an_experiment_refuses_its_committed_folder_in_one_line_and_changes_nothing():
  before = subprocess.run(["git", "status", "--porcelain", "--", "experiments/bandit_router"], cwd=ROOT,
                          capture_output=True, text=True).stdout
  r = subprocess.run([sys.executable, "-m", "experiments.bandit_router.regret", "--out", "experiments/bandit_router",
                      "--steps", "10", "--seeds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
  assert r.stderr.startswith("error: --out experiments/bandit_router: holds ")
  after = subprocess.run(["git", "status", "--porcelain", "--", "experiments/bandit_router"], cwd=ROOT,
                         capture_output=True, text=True).stdout
  assert after == before
