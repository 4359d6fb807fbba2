"""experiments/luffy/run.py's final table: taken at the final step, over the seeds that reached it."""
import json

from experiments.luffy.run import final_table
import pytest

pytestmark = pytest.mark.fast


def _run(root, name, evals):
  d = root / name
  d.mkdir(parents=True)
  (d / "history.json").write_text(json.dumps([{"step": s, "eval_accuracy": a} for s, a in evals]))


def test_final_table_uses_the_final_step_and_names_cut_short_seeds(tmp_path):
  _run(tmp_path, "rl-0", [(0, 0.0), (50, 0.2), (100, 0.4)])
  _run(tmp_path, "rl-1", [(0, 0.0), (50, 0.6), (100, 0.8)])
  _run(tmp_path, "rl-2", [(0, 0.0), (50, 0.9)])  # cut short: its last evaluation is at step 50
  table, finals = final_table(tmp_path, ["rl"], [0, 1, 2], 8, {"rl": 100})
  assert [h["step"] for h in finals["rl"]] == [100, 100]
  row = table.splitlines()[2]
  assert row.startswith("| rl | 100 (n=2; 1 cut short) | 0.600 ± ")  # mean of 0.4 and 0.8, not 0.9
  table, finals = final_table(tmp_path, ["rl"], [0, 1, 2], 8)  # default: each seed's last evaluation
  assert [h["eval_accuracy"] for h in finals["rl"]] == [0.4, 0.8, 0.9]
