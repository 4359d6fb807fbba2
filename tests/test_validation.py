"""One validation pass at resolve time (`fineflax.jobs.resolve.validate`): environment hooks
(`Env.validate`), unknown environments, reward names found whatever was imported before; through
launch.py every such user error is one line on stderr and exit 2, before any weight loads."""
import os
import subprocess
import sys

import pytest

from fineflax.config_checks import ConfigError
from fineflax.jobs.resolve import load_config, validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _error_line(*args) -> str:
  r = subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), *args], cwd=ROOT, capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]


@pytest.mark.fast
@pytest.mark.parametrize("spec, over, message", [
    ("configs/luffy_arith.py:smoke", "task.eval_split=dev",
     "config.task.eval_split='dev': choose one of 'test', 'validation'"),
    ("configs/grpo_arith.py:smoke", "task.num_steps=(2, 7)", "config.task.num_steps=(2, 7): an int in 1..5"),
    ("configs/grpo_arith.py:smoke", "env=bogus", "config.env='bogus': choose one of 'arithmetic', 'dataset', 'search_r1'"),
    ("configs/search_r1.py:smoke", "rl.luffy.traces_path=t.jsonl",
     "config.rl.luffy.traces_path='t.jsonl': '' (search_r1 demonstrations are scripted"),
    ("configs/grpo_arith.py:luffy,smoke", "rl.luffy.n_off=4", "config.rl.luffy.n_off=4: LUFFY needs 1 <= n_off < group_size=4"),
])
def test_environment_and_rl_fields_fail_at_resolve_time(spec, over, message):
  with pytest.raises(ConfigError) as e:
    validate(load_config(spec, [over]))
  assert message in str(e.value)


def test_launch_user_errors_are_one_line_and_exit_2():
  line = _error_line("--config", "configs/luffy_arith.py:smoke", "--config.task.eval_split=dev")
  assert line == "error: config.task.eval_split='dev': choose one of 'test', 'validation'"
  line = _error_line("--config", "configs/grpo_arith.py:smoke", "--config.env=bogus", "--dry_run")
  assert line == "error: config.env='bogus': choose one of 'arithmetic', 'dataset', 'search_r1'"
  line = _error_line("--config", "configs/grpo_arith.py:luffy,smoke", "--config.rl.luffy.gamma=0")
  assert line == "error: config.rl.luffy.gamma=0.0: must be in (0.0, inf]"


def test_search_r1_rewards_are_found_without_importing_their_environment():
  code = """
import sys
from fineflax.jobs.resolve import load_config, validate
c = load_config("configs/grpo_arith.py:smoke")
with c.unlocked():
  c.rewards.search_r1_em = 1.0
validate(c)  # the arithmetic env: nothing imports the Search-R1 modules
assert not any(m.startswith("fineflax.search_r1") or m == "fineflax.envs.search_r1" for m in sys.modules)
from fineflax.rewards import get_reward
assert get_reward("search_r1_em").__module__ == "fineflax.search_r1.rewards" in sys.modules
print("OK")
"""
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and r.stdout.strip() == "OK", r.stderr[-2000:]


@pytest.mark.fast
def test_every_provided_reward_is_registered_by_its_module():
  import importlib
  from fineflax.rewards.registry import PROVIDERS, REWARDS
  for name, module in PROVIDERS.items():
    importlib.import_module(module)
    assert name in REWARDS and REWARDS[name].__module__ == module, name
