"""The README's code runs as written: its Python blocks in order in one fresh interpreter (they build on
each other), and its `--dry_run` command lines. A block preceded by `<!-- readme-test: skip (why) -->`
is not run (the reason is in the README next to it)."""
import os
import re
import shlex
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


@pytest.mark.long
def test_python_blocks_run_in_order(tmp_path):
  code = "\n\n".join(src for run, src in _blocks("python") if run)
  assert "load(" in code and "quantize_params" in code and "create_search_engine" in code
  r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                     env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
  assert r.returncode == 0, r.stderr[-3000:]
  assert (tmp_path / "runs" / "adapter" / "adapter_config.json").exists()


def with_this_python(line: str) -> str:
  """A README shell line with each command `python` replaced by this interpreter (the suite may run with a
  venv's python that is not the `python` on PATH)."""
  return re.sub(r"(^|&&|;|\|)(\s*)python(?=\s)", lambda m: m.group(1) + m.group(2) + shlex.quote(sys.executable),
                line.strip())


def test_dry_run_lines_run(tmp_path):
  lines = [ln for run, src in _blocks("bash") if run for ln in src.splitlines() if "--dry_run" in ln]
  assert lines
  fake = tmp_path / "python"  # a `python` on PATH that is not this interpreter
  fake.write_text("#!/bin/sh\necho 'not the suite interpreter' >&2\nexit 3\n")
  fake.chmod(0o755)
  env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
  for ln in lines:
    r = subprocess.run(with_this_python(ln), shell=True, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, (ln, r.stderr[-2000:])


def _readme() -> str:
  return open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def test_ci_runs_exactly_the_readme_test_command():
  """The README's install-and-test line is CI's command; its fast-tier line is the same pytest run with
  `-m "not slow"`."""
  test_lines = [ln for _, src in _blocks("bash") for ln in src.splitlines() if "pytest" in ln]
  full = [ln for ln in test_lines if ln.startswith("pip install")]
  assert len(full) == 1, test_lines
  ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read().strip().splitlines()
  assert ci[-1] == full[0]
  pytest_cmd = full[0].rsplit(" && ", 1)[1]
  assert [ln for ln in test_lines if ln != full[0]] == [pytest_cmd.replace(" tests", ' -m "not slow" tests')]


def test_from_feedback_reads_the_log_the_server_writes():
  from fineflax.serve.__main__ import parse_args
  logs = re.findall(r"fineflax\.data\.from_feedback --log (\S+)", _readme())
  assert logs and set(logs) == {parse_args(["--model", "m"]).log}


def test_the_data_sources_example_names_bundled_samples():
  from fineflax.data.sources import SAMPLES_DIR
  [spec] = re.findall(r'config\.data\.sources = "([^"]+)"', _readme())
  names = [item.rsplit(":", 1)[0] for item in spec.split(",")]
  assert len(names) >= 2 and all((SAMPLES_DIR / n).is_file() for n in names), names


def test_tensorboard_is_named_with_its_install(tmp_path, capsys):
  """Runs write TensorBoard event files (tensorboardX); the viewer is no dependency, so the README and the
  closing lines of a run that point to it say how to install it."""
  from fineflax.train.loop import LoopResult, write_summary
  text = _readme()
  pyproject = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
  if re.search(r'^\s*"tensorboard[>=<"]', pyproject, re.M):
    return
  assert "TensorBoard" in text and "pip install tensorboard" in text
  write_summary(str(tmp_path), LoopResult(state=None, history=[], status="completed", step=1))
  [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("logs: ")]
  assert "metrics.jsonl" in line and "pip install tensorboard && tensorboard --logdir" in line


def _bash_commands() -> list[str]:
  """The README's shell commands, continuation lines joined, comments dropped."""
  out = []
  for _, src in _blocks("bash"):
    for cmd in re.sub(r"\\\n\s*", " ", src).splitlines():
      cmd = re.sub(r"(^|\s)#\s.*$", "", cmd).strip()
      if cmd:
        out.append(cmd)
  return out


def test_the_tour_evals_and_distillation_read_what_the_readme_makes():
  """The A/B eval's endpoint variant and judge name a model that a README serve line serves on that port
  (another name is a 404), and every `runs/NAME/adapter` the tour reads is a workdir a README launch line
  writes (the main job's, or one the tour makes)."""
  from fineflax.serve.__main__ import parse_args
  cmds = _bash_commands()
  served = set()
  for cmd in cmds:
    if "-m fineflax.serve " in cmd:
      args = parse_args(shlex.split(cmd.split("-m fineflax.serve ", 1)[1]))
      served.add((args.port, args.name or os.path.splitext(os.path.basename(args.model.rstrip("/")))[0]))
  [ab] = [c for c in cmds if "-m fineflax.evals --a " in c]
  wanted = {(int(p), m) for p, m in re.findall(r"http://127\.0\.0\.1:(\d+)/v1#(\S+)", ab)}
  judge = re.search(r"--judge-url http://127\.0\.0\.1:(\d+)/v1 --judge-model (\S+)", ab)
  assert wanted and judge, ab
  wanted.add((int(judge.group(1)), judge.group(2)))
  assert wanted <= served, (wanted, served)
  written = {m.group(1) for c in cmds if "launch.py" in c for m in re.finditer(r"--workdir (runs/[^\s/]+)", c)}
  read = {m for c in cmds if re.search(r"-m fineflax\.(serve|evals) |configs/distill\.py", c)
          for m in re.findall(r"(runs/[^\s/=+]+)/adapter", c)}
  assert read and read <= written, (read, written)
