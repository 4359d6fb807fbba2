"""`python launch.py --help`, `--helpfull` and `--config X --help` (issue 52: each printed an error): the flags,
every config with its presets, and a config's fields with the values its presets give; exit 0, no model loaded."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from fineflax.jobs.help import fields_of, wants_help
from fineflax.jobs.resolve import load_config

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _launch(*args):
  return subprocess.run([sys.executable, "launch.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _configs_with_presets() -> dict[str, list[str]]:
  """{relative path: preset names} of every config file, read here independently of fineflax.jobs.help."""
  out = {}
  for path in sorted(ROOT.glob("configs/**/*.py")):
    if "def get_config" not in path.read_text():
      continue
    spec = importlib.util.spec_from_file_location(f"t_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out[str(path.relative_to(ROOT))] = list(getattr(module, "PRESETS", {}))
  return out


@pytest.mark.fast
def test_help_lists_the_flags_and_every_config_with_its_presets():
  r = _launch("--help")
  assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
  for flag in ("--config", "--workdir", "--dry_run", "--devices", "--device_memory_gb", "--verbose", "--config.KEY"):
    assert f"\n  {flag}" in r.stdout, flag
  configs = _configs_with_presets()
  assert len(configs) >= 10 and "configs/quickstart.py" in configs
  lines = r.stdout.splitlines()
  for path, presets in configs.items():
    [line] = [ln for ln in lines if ln.strip().split("  ")[0] == path]
    assert line.endswith(f"presets: {', '.join(presets)}") if presets else "presets" not in line, (path, line)
  full = _launch("--helpfull")
  assert full.returncode == 0 and full.stdout.startswith(r.stdout.rstrip("\n")) and len(full.stdout) > len(r.stdout)
  assert _launch("-h").stdout == r.stdout


def test_config_help_lists_presets_and_the_fields_its_presets_give():
  r = _launch("--config", "configs/grpo_arith.py:smoke", "--help")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "presets: " + ", ".join(_configs_with_presets()["configs/grpo_arith.py"]) in r.stdout
  config = load_config("configs/grpo_arith.py:smoke")
  for key, value in [("rl.max_new_tokens", config.rl.max_new_tokens), ("num_steps", config.num_steps),
                     ("task.num_steps", config.task.num_steps), ("model.source", config.model.source)]:
    assert f"\n  config.{key} = {value!r}\n" in r.stdout, key
  assert config.rl.max_new_tokens != load_config("configs/grpo_arith.py").rl.max_new_tokens  # the preset shows
  bad = _launch("--config", "configs/grpo_arith.py:nope", "--help")
  assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "unknown preset 'nope'" in bad.stderr


@pytest.mark.fast
def test_fields_keep_tuples_and_help_flags_are_found_anywhere():
  import ml_collections
  c = ml_collections.ConfigDict({"a": 1, "task": {"num_steps": (1, 3), "name": "x"}})
  assert fields_of(c) == {"config.a": 1, "config.task.num_steps": (1, 3), "config.task.name": "x"}
  assert wants_help(["launch.py", "--config", "c.py", "-h"]) and not wants_help(["launch.py", "--config", "--help.py"])
