"""experiments/compare.py end to end on a tiny model (2 methods x 1 seed, one step each): every run's
history, the table and the plot (run as a script, as on a GPU machine)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.long
def test_compare_runs_methods_and_tabulates(tiny_smol, tmp_path):
  out = tmp_path / "cmp"
  over = [f"model.source={tiny_smol}", "num_steps=1", "eval_every=1", "rl.max_new_tokens=8",
          "task.num_eval=4", "eval_batch_size=4", "task.num_train=16",
          "lora.targets=('q','v')"]  # 4 adapter tensors per layer instead of 14: faster compiles
  r = subprocess.run([sys.executable, "-m", "experiments.compare", "--config", "configs/grpo_arith.py",
                      "--method", "grpo=smoke,grpo", "--method", "exgrpo=smoke,exgrpo;rl.exgrpo.threshold=0.0",
                      "--seeds", "3", "--set", *over, "--out", str(out), "--parallel", "1",
                      "--extra-metrics", "reward_mean"],
                     cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  res = json.loads((out / "results.json").read_text())
  assert set(res["runs"]) == {"grpo", "exgrpo"}
  assert [e["step"] for e in res["runs"]["exgrpo"]["3"]["evals"]] == [0, 1]
  md = (out / "RESULTS.md").read_text()
  assert "| grpo | " in md and "| exgrpo | " in md and "### reward_mean" in md
  assert (out / "curves.png").stat().st_size > 1000
