"""rl.micro_batch_tokens is refused at resolve time when a training row could overflow it (issue 52): the longest
row is the environment's longest prompt + rl.max_new_tokens. Before, only max_new_tokens was compared and the run
died mid-step (`row 0 holds 98 tokens (prompt + completion)`)."""
import os
import subprocess
import sys

import pytest

from fineflax.config_checks import ConfigError
from fineflax.envs.arithmetic import ArithmeticEnv, prompt_ids
from fineflax.jobs.resolve import load_config, validate
from fineflax.models import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(*over):
  return load_config("configs/grpo_arith.py:smoke", ["task.num_train=300", *over])


@pytest.mark.fast
def test_longest_prompt_equals_formatting_every_training_prompt():
  c = _config("task.num_steps=(1,3)")
  tok = load_tokenizer(c.model.source)
  every = [len(prompt_ids(tok, c.task.system_prompt, p.question, c.task.assistant_prefix))
           for p in ArithmeticEnv._train_items(c)]
  assert ArithmeticEnv.longest_prompt_tokens(c) == max(every)


def test_a_budget_below_the_longest_row_is_refused_and_one_at_it_passes():
  c = _config()
  longest = ArithmeticEnv.longest_prompt_tokens(c) + c.rl.max_new_tokens
  assert longest > c.rl.max_new_tokens + 1  # the old check (budget > max_new_tokens) would pass longest - 1
  with pytest.raises(ConfigError, match=rf"^config.rl.micro_batch_tokens={longest - 1}: a row can hold {longest} "):
    validate(_config(f"rl.micro_batch_tokens={longest - 1}"))
  assert validate(_config(f"rl.micro_batch_tokens={longest}")).micro_batch_tokens == longest


def test_launch_refuses_the_issue_budget_in_one_line_before_loading(tmp_path):
  r = subprocess.run([sys.executable, "launch.py", "--config", "configs/grpo_arith.py:smoke",
                      "--config.rl.micro_batch_tokens=64", "--workdir", str(tmp_path / "run")], cwd=ROOT,
                     capture_output=True, text=True, timeout=300)
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: config.rl.micro_batch_tokens=64: "
                                                                       "a row can hold "), r.stderr[-2000:]
  assert not (tmp_path / "run").exists()
