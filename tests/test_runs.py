"""fineflax.runs: parallel runs (a crash does not stop the others), histories of stopped runs, 95% CIs."""
import json
import math
import sys

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fineflax.runs import load_history, mean_ci95, run_parallel, summary_table

pytestmark = pytest.mark.fast


def test_run_parallel_reports_exit_codes_and_logs(tmp_path):
  cmds = {"ok": [sys.executable, "-c", "print('hello')"],
          "bad": [sys.executable, "-c", "import sys; print('oops'); sys.exit(3)"],
          "slow": [sys.executable, "-c", "import time; time.sleep(1.0); print('done')"]}
  codes = run_parallel(cmds, str(tmp_path / "logs"), max_parallel=2)
  assert codes == {"ok": 0, "bad": 3, "slow": 0}
  assert (tmp_path / "logs" / "bad.log").read_text().strip() == "oops"
  assert (tmp_path / "logs" / "slow.log").read_text().strip() == "done"


def test_runs_are_placed_on_the_given_gpus(tmp_path):
  cmd = [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], "
         "os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION'])"]
  codes = run_parallel({f"r{i}": cmd for i in range(4)}, str(tmp_path), gpus=[2, 5], per_gpu=2)
  assert set(codes.values()) == {0}
  seen = sorted((tmp_path / f"r{i}.log").read_text().split()[0] for i in range(4))
  assert seen == ["2", "2", "5", "5"] and (tmp_path / "r0.log").read_text().split()[1] == "0.45"


def test_load_history_prefers_history_then_falls_back_to_logged_metrics(tmp_path):
  logs = tmp_path / "run" / "logs"
  logs.mkdir(parents=True)
  steps = [{"step": 0, "eval_accuracy": 0.1}, {"step": 1, "reward_mean": 0.2},
           {"step": 2, "reward_mean": 0.3, "eval_accuracy": 0.25}]
  (logs / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
  assert load_history(str(tmp_path / "run")) == (steps, False)
  (tmp_path / "run" / "history.json").write_text(json.dumps(steps[:2]))
  assert load_history(str(tmp_path / "run")) == (steps[:2], True)
  (tmp_path / "run" / "config.json").write_text(json.dumps({"num_steps": 2}))  # stopped at step 1 of 2
  assert load_history(str(tmp_path / "run")) == (steps[:2], False)
  (tmp_path / "run" / "config.json").write_text(json.dumps({"num_steps": 1}))
  assert load_history(str(tmp_path / "run")) == (steps[:2], True)
  with pytest.raises(FileNotFoundError, match="neither history.json"):
    load_history(str(tmp_path / "missing"))


def test_mean_ci95_is_the_t_interval():
  x = [0.1, 0.3, 0.2, 0.6]
  mean, half = mean_ci95(x)
  t_975_3 = 3.182446305284263  # Student t quantile, 3 degrees of freedom
  assert mean == pytest.approx(0.3) and half == pytest.approx(t_975_3 * np.std(x, ddof=1) / 2)
  assert half == pytest.approx(scipy_stats.t.interval(0.95, 3, loc=0.3, scale=scipy_stats.sem(x))[1] - 0.3)
  assert math.isnan(mean_ci95([0.5])[1])


def test_summary_table_has_one_cell_per_method_and_step():
  h = lambda *acc: [{"step": s, "eval_accuracy": a} for s, a in zip((0, 10), acc)]
  table = summary_table({"grpo": [h(0.1, 0.2), h(0.1, 0.4)], "luffy": [h(0.1, 0.5)]}, "eval_accuracy")
  lines = table.splitlines()
  assert lines[0] == "| method | step 0 | step 10 |"
  assert lines[2].startswith("| grpo | 0.100 ± 0.000 (n=2) | 0.300 ± ")
  assert lines[3] == "| luffy | 0.100 (n=1) | 0.500 (n=1) |"


def test_runs_fill_every_gpu_before_doubling_up(tmp_path):
  cmd = [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]
  run_parallel({f"r{i}": cmd for i in range(2)}, str(tmp_path), gpus=[2, 5], per_gpu=2)
  assert sorted((tmp_path / f"r{i}.log").read_text().strip() for i in range(2)) == ["2", "5"]


def test_time_budget_stops_runs_and_skips_those_it_cannot_start(tmp_path):
  import time
  from fineflax.runs import NOT_STARTED
  slow = [sys.executable, "-c", "import time; time.sleep(30)"]
  t0 = time.time()
  codes = run_parallel({"a": slow, "b": slow}, str(tmp_path), max_parallel=1, deadline=t0 + 2, min_run_s=1)
  assert codes == {"a": 124, "b": NOT_STARTED}  # timeout's exit code after SIGTERM; b had < 1 s left
  assert time.time() - t0 < 10


def test_seed_evaluations_skip_missing_runs_and_records_without_the_metric(tmp_path):
  import json
  from fineflax.runs import seed_evaluations
  (tmp_path / "m-0").mkdir()
  (tmp_path / "m-0" / "history.json").write_text(json.dumps(
      [{"step": 0, "eval_em": 0.1}, {"step": 1, "loss": 2.0}, {"step": 2, "eval_em": 0.3}]))
  (tmp_path / "m-2").mkdir()
  (tmp_path / "m-2" / "history.json").write_text(json.dumps([{"step": 1, "loss": 1.0}]))
  out = seed_evaluations(tmp_path, "m", [0, 1, 2], "eval_em")
  assert [[h["step"] for h in e] for e in out] == [[0, 2]]
