"""The experiment helpers: parallel subprocess runs, and tabulating runs that were stopped early."""
import json
import sys

import pytest

from experiments.common import run_parallel
from experiments.luffy.run import load_run


def test_run_parallel_reports_exit_codes_and_logs(tmp_path):
  cmds = {"ok": [sys.executable, "-c", "print('hello')"],
          "bad": [sys.executable, "-c", "import sys; print('oops'); sys.exit(3)"],
          "slow": [sys.executable, "-c", "import time; time.sleep(1.5); print('done')"]}
  codes = run_parallel(cmds, str(tmp_path / "logs"), max_parallel=2)
  assert codes == {"ok": 0, "bad": 3, "slow": 0}
  assert (tmp_path / "logs" / "bad.log").read_text().strip() == "oops"
  assert (tmp_path / "logs" / "slow.log").read_text().strip() == "done"


def test_load_run_prefers_history_then_falls_back_to_logged_metrics(tmp_path):
  logs = tmp_path / "luffy-1" / "logs"
  logs.mkdir(parents=True)
  steps = [{"step": 0, "eval_accuracy": 0.1}, {"step": 1, "reward_mean": 0.2},
           {"step": 2, "reward_mean": 0.3, "eval_accuracy": 0.25}]
  (logs / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
  run = load_run(str(tmp_path), "luffy", 1)
  assert run["finished"] is False and run["steps_run"] == 2 and run["history"] == steps
  (tmp_path / "luffy-1" / "history.json").write_text(json.dumps(steps[:2]))
  run = load_run(str(tmp_path), "luffy", 1)
  assert run["finished"] is True and run["steps_run"] == 1
  with pytest.raises(FileNotFoundError, match="grpo seed 0"):
    load_run(str(tmp_path), "grpo", 0)


def test_sweep_variants_name_their_settings_whatever_the_defaults():
  from experiments.common import apply_overrides, load_config
  from experiments.grpo_arith.sweep import VARIANTS
  got = {}
  for name, over in VARIANTS.items():
    c = load_config("configs/grpo_arith.py")
    apply_overrides(c, over)  # every key exists in the config
    got[name] = (c.rl.agg_mode, c.rl.mask_truncated, c.rl.dynamic_sampling, c.rl.temperature)
  assert got["grpo_T1"] == ("seq-mean-token-mean", False, False, 1.0)
  assert got["grpo"] == ("seq-mean-token-mean", False, False, 0.7)
  assert got["drgrpo"] == ("sum", True, False, 0.7)
  assert got["dapo"] == ("token-mean", True, True, 0.7) and got["dapo_T1"][3] == 1.0
