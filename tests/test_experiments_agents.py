"""experiments/agents/run.py --smoke runs end to end on the tiny model and writes its report."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_agents_experiment_smoke(tiny_smol, tmp_path):
  out = tmp_path / "out"
  proc = subprocess.run([sys.executable, "experiments/agents/run.py", "--smoke", "--model", tiny_smol, "--seeds", "0",
                         "--out", str(out), "--rl-set", "num_steps=1", "eval_at_start=False", "task.num_eval=2"],
                        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=900)
  assert proc.returncode == 0, proc.stderr[-2000:]
  res = json.loads((out / "results.json").read_text())
  assert list(res["rl"]) == ["0"] and 0 <= res["rl"]["0"]["after"] <= 1
  assert res["apo"]["split"] == {"gradient": 4, "val": 2, "test": 2} and res["apo"]["best_prompt"]
  md = (out / "RESULTS.md").read_text()
  assert "| 0 |" in md and "Best prompt" in md and (out / "accuracy_curve.png").exists()
