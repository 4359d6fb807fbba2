"""launch.py and config resolution: --dry_run without weights; one-line errors (exit 2) that name the key,
value and allowed values, before any work; presets; resume checks against the saved config."""
import os
import signal
import subprocess
import sys
import time

import pytest

from fineflax.config_checks import ConfigError
from fineflax.jobs.resolve import load_config, validate
from fineflax.train.run_config import ConfigChanged, check_resumable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(*args, cwd=ROOT):
  return subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), *args], cwd=cwd,
                        capture_output=True, text=True, timeout=120)


def test_dry_run_reports_counts_and_memory():
  r = _launch("--config", "configs/quickstart.py", "--dry_run", "--config.lora.r=8")
  assert r.returncode == 0, r.stderr
  assert "parameters: 134,515,008" in r.stdout  # SmolLM2-135M, tied embeddings
  assert "trainable LoRA parameters (r=8):" in r.stdout
  assert "# memory plan per device" in r.stdout and "update phase:" in r.stdout and "verdict:" in r.stdout
  assert "r: 8" in r.stdout  # the resolved config


def test_bad_rl_value_fails_in_seconds_naming_key_and_choices():
  t0 = time.time()
  r = _launch("--config", "configs/grpo_arith.py:smoke", "--config.rl.agg_mode=bogus", "--dry_run")
  assert r.returncode == 2 and time.time() - t0 < 60
  assert r.stderr.strip().splitlines() == [
      "error: config.rl.agg_mode='bogus': choose one of 'token-mean', 'seq-mean-token-mean', "
      "'seq-mean-token-sum', 'seq-mean-token-sum-norm', 'sum'"]


def test_unknown_key_and_wrong_type_are_one_line_errors():
  r = _launch("--config", "configs/quickstart.py", "--dry_run", "--config.lora.rank=8")
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
  assert "unknown config key config.lora.rank in configs/quickstart.py; closest: lora.r" in r.stderr
  r = _launch("--config", "configs/quickstart.py", "--dry_run", "--config.lora.r=eight")
  assert r.returncode == 2 and "config.lora.r='eight'" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("override,message", [
    ("lora.r=0", "config.lora.r=0: must be a positive integer"),
    ("lora.r=-4", "config.lora.r=-4: must be a positive integer"),
    ("lora.dropout=1.5", "config.lora.dropout=1.5: must be in [0.0, 1.0)"),
    ("model.quant=nf3", "config.model.quant='nf3': choose one of 'none', 'nf4', 'int8'"),
    ("model.attention=flash", "config.model.attention='flash': choose one of 'auto', 'cudnn', 'xla'"),
    ("lora.targets=('qkv',)", "config.lora.targets=('qkv',): linear names"),
    ("rl.group_size=1", "config.rl.group_size=1: group advantages need >= 2"),
    ("rl.objective=dpo", "config.rl.objective='dpo': choose one of 'grpo', 'luffy', 'exgrpo', 'ppo'"),
    ("rl.objective=luffy", "config.rl.luffy is missing"),
    ("rewards.nonexistent=1.0", "unknown config key config.rewards.nonexistent"),
])
def test_bounded_fields_are_checked_when_the_config_is_resolved(override, message):
  with pytest.raises(ConfigError) as e:
    validate(load_config("configs/grpo_arith.py:smoke", [override]))
  assert message in str(e.value)


def test_presets_compose_in_order():
  c = load_config("configs/grpo_arith.py:luffy,smoke")
  assert (c.rl.objective, c.rl.clip, c.rl.agg_mode, c.rl.advantage_scale, c.rl.entropy_coef) == (
      "luffy", False, "sum", "none", 0.001)
  assert c.rl.luffy.gamma == 0.1 and c.rl.group_size == 4 and "exgrpo" not in c.rl
  c = load_config("configs/grpo_arith.py:grpo,dr_grpo")
  assert (c.rl.agg_mode, c.rl.advantage_scale, c.rl.epsilon_high) == ("seq-mean-token-sum-norm", "none", 0.2)
  c = load_config("configs/grpo_arith.py:dapo,exgrpo")
  assert c.rl.dynamic_sampling and c.rl.mask_truncated and c.rl.exgrpo.threshold == 0.35
  with pytest.raises(ConfigError, match="unknown preset 'bogus'; known: grpo, dapo, dr_grpo, luffy, exgrpo"):
    load_config("configs/grpo_arith.py:bogus")
  c = load_config("configs/grpo_arith.py", ["task.num_steps=(1, 3)"])  # ml-collections parses tuples
  assert tuple(c.task.num_steps) == (1, 3)
  for spec in ("configs/grpo_arith.py:luffy,smoke", "configs/grpo_arith.py:exgrpo", "configs/search_r1.py",
               "configs/search_r1.py:grpo_only,smoke", "configs/quickstart.py", "configs/chat.py"):
    validate(load_config(spec))


def test_unknown_job_is_named(tmp_path):
  cfg = tmp_path / "bad.py"
  cfg.write_text("import ml_collections\n\ndef get_config():\n  c = ml_collections.ConfigDict()\n"
                 "  c.job = 'dance'\n  return c\n")
  r = _launch("--config", str(cfg), "--dry_run")
  assert r.returncode == 2 and "config.job='dance' is not a job" in r.stderr


def test_missing_model_is_one_line_and_leaves_no_workdir(tmp_path):
  r = _launch("--config", "configs/grpo_arith.py:smoke", "--config.model.source=/nonexistent/model.gguf",
              "--workdir", str(tmp_path / "run"))
  assert r.returncode == 2 and "Traceback" not in r.stderr
  assert r.stderr.strip().splitlines()[-1].startswith("error: '/nonexistent/model.gguf': no such file")
  assert not (tmp_path / "run").exists()


def test_resume_refuses_a_changed_config_and_resume_false_moves_the_old_run_aside(tmp_path):
  c = load_config("configs/quickstart.py")
  check_resumable(c, str(tmp_path))
  (tmp_path / "checkpoints" / "4").mkdir(parents=True)
  check_resumable(load_config("configs/quickstart.py", ["optimizer.num_steps=60", "eval_every=5"]),
                  str(tmp_path))  # longer run, other cadence: the same run
  changed = load_config("configs/quickstart.py", ["lora.r=8"])
  with pytest.raises(ConfigChanged, match=r"1 field\(s\) differ: lora.r: 16 -> 8.*--config.resume=false"):
    check_resumable(changed, str(tmp_path))
  check_resumable(load_config("configs/quickstart.py", ["lora.r=8", "resume=false"]), str(tmp_path))
  aside = [p for p in tmp_path.iterdir() if p.name.startswith("replaced-")]
  assert len(aside) == 1 and (aside[0] / "checkpoints" / "4").is_dir()
  assert not (tmp_path / "checkpoints").exists()


NO_MODEL = "--config.model.source=/nonexistent/model.gguf"  # an error about the model = the load was tried


def _one_line_error(r) -> str:
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]


def test_a_missing_config_file_is_one_line_with_the_closest_name_and_relative_paths_work_anywhere(tmp_path):
  line = _one_line_error(_launch("--config", "configs/quickstrat.py:smoke", "--dry_run"))
  assert line.startswith("error: --config=configs/quickstrat.py:smoke: no such config file (looked for ")
  assert line.endswith("closest: configs/quickstart.py")
  r = _launch("--config", "configs/quickstart.py", "--dry_run", cwd=tmp_path)  # the README's path, another folder
  assert r.returncode == 0 and "parameters: 134,515,008" in r.stdout, r.stderr[-2000:]


def test_a_workdir_that_is_a_file_is_one_line_before_the_model_loads(tmp_path):
  (tmp_path / "file").write_text("x")
  line = _one_line_error(_launch("--config", "configs/quickstart.py", "--workdir", str(tmp_path / "file"), NO_MODEL))
  assert line == f"error: workdir {tmp_path / 'file'} is a file; pass --workdir a folder (new or an earlier run's)"
  line = _one_line_error(_launch("--config", "configs/quickstart.py", "--workdir", str(tmp_path / "file" / "run"),
                                 NO_MODEL))
  assert f"is under {tmp_path / 'file'}, which is a file" in line


def test_bad_data_and_a_changed_config_are_refused_before_the_model_loads(tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
                 "not json\n")
  r = _launch("--config", "configs/quickstart.py", "--workdir", str(tmp_path / "run"), NO_MODEL,
              f"--config.data.sources={bad}")
  assert _one_line_error(r).startswith(f"error: {bad}:line 2: ")
  assert not (tmp_path / "run").exists()
  work = tmp_path / "old"
  check_resumable(load_config("configs/quickstart.py", [NO_MODEL]), str(work))  # an earlier run's config...
  (work / "checkpoints" / "4").mkdir(parents=True)  # ...and checkpoints
  r = _launch("--config", "configs/quickstart.py", "--workdir", str(work), NO_MODEL, "--config.lora.r=8")
  assert "1 field(s) differ: lora.r: 16 -> 8" in _one_line_error(r)


def test_an_already_complete_run_says_so_before_the_model_loads(tmp_path):
  import numpy as np
  from fineflax.train.checkpoint import Checkpointer
  over = [NO_MODEL, "--config.optimizer.num_steps=2"]
  check_resumable(load_config("configs/quickstart.py", over), str(tmp_path))
  ckpt = Checkpointer(str(tmp_path / "checkpoints"))
  assert ckpt.save(2, {"x": np.zeros(2, np.float32)}, {"job": {}})
  ckpt.close()
  (tmp_path / "summary.json").write_text('{"status": "completed"}')
  r = _launch("--config", "configs/quickstart.py", "--workdir", str(tmp_path), *over)
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"already complete at step 2 of 2; nothing to do ({tmp_path})" in r.stdout


def test_the_chat_job_names_no_workdir(tmp_path):
  r = _launch("--config", "configs/chat.py", NO_MODEL, cwd=tmp_path)
  assert "no such file" in _one_line_error(r)
  assert "workdir" not in r.stdout and not (tmp_path / "runs").exists()


def test_smoke_presets_state_their_measured_time():
  import re
  for name in ("grpo_arith", "search_r1", "luffy_arith", "agent_rl", "apo", "dataset_rl"):
    text = open(os.path.join(ROOT, "configs", f"{name}.py"), encoding="utf-8").read()
    assert not re.search(r"seconds on a CPU|under a minute", text), name  # claims the runs did not bear out
    assert re.search(r"smoke test[^\n]*: \d+ s with SmolLM2-135M on 2 CPU cores", text), name


def test_a_missing_teacher_is_named_before_the_models_load(tmp_path):
  """The README's distillation line names a teacher adapter another run writes: before that run it is one
  line naming the field (the student's missing model would be named instead if the load came first)."""
  adapter = tmp_path / "grpo" / "adapter"
  line = _one_line_error(_launch("--config", "configs/distill.py", "--workdir", str(tmp_path / "run"), NO_MODEL,
                                 f"--config.teacher.adapter={adapter}"))
  assert line == f"error: config.teacher.adapter='{adapter}': {adapter}: no adapter_config.json (is this a PEFT " \
                 "adapter folder?)"
  line = _one_line_error(_launch("--config", "configs/distill.py", "--workdir", str(tmp_path / "run"), NO_MODEL,
                                 f"--config.teacher.source={tmp_path}/teacher.gguf"))
  assert line.startswith(f"error: config.teacher.source='{tmp_path}/teacher.gguf': ")
  assert not (tmp_path / "run").exists()


def test_sigint_while_the_model_loads_is_one_line_and_exit_130(tmp_path):
  """Issue 52: Ctrl-C before training starts (here while the bundled SmolLM2 loads, which takes over 10 s on
  2 cores) prints one line, no traceback, and exits 130 as a stopped run does."""
  proc = subprocess.Popen([sys.executable, "-u", "launch.py", "--config", "configs/quickstart.py", "--workdir",
                           str(tmp_path / "run")], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline().startswith("workdir:")  # printed just before the job loads the model
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 130, err[-3000:]
  assert err.strip().splitlines() == [
      "interrupted (SIGINT) before the training loop ran or after it ended: nothing more was saved"], err[-3000:]


@pytest.mark.fast
def test_a_keyboard_interrupt_dropped_by_python_is_raised_again_in_ordinary_code(capsys):
  """Python drops an exception raised in a `__del__` or gc callback (where JAX's _xla_gc_callback met a SIGINT
  during the model load, and the run went on to train); `sigint_until_caught` raises it again, silently."""
  from fineflax.cli import sigint_until_caught

  class RaisesWhenCollected:
    def __del__(self):
      raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    with sigint_until_caught():
      RaisesWhenCollected()
      deadline = time.time() + 30
      while time.time() < deadline:
        time.sleep(0.01)
  assert "Exception ignored" not in capsys.readouterr().err
