"""The SFT job end to end on a tiny model: falling loss, exact resume, NaN stop, clean stop, exports."""
import json
import os
import signal

import numpy as np
import pytest

from fineflax.jobs.resolve import load_config
from fineflax.train.metric_writer import read_jsonl


@pytest.fixture(scope="module")
def tiny_source(tiny_smol):
  return tiny_smol


def _config(source, num_steps=8, **over):
  over = {"model.source": source, "optimizer.num_steps": num_steps, "optimizer.warmup_steps": 2,
          "optimizer.learning_rate": 3e-2, "data.batch_size": 4, "data.max_length": 64,
          "data.eval_batches": 1, "eval_every": 4, "log_every": 1, "checkpoint.every": 2,
          "sample_prompt": "", **over}
  return load_config("configs/quickstart.py", [f"{k}={v}" for k, v in over.items()])


class StopAfter:
  """Stands in for StopRequested: becomes true after `n` polls, like a SIGTERM at step n."""
  def __init__(self, n):
    self.n, self.polls, self.signal_name = n, 0, "SIGTERM"
  def __call__(self):
    return self
  def __enter__(self):
    return self
  def __exit__(self, *a):
    return False
  def __bool__(self):
    self.polls += 1
    return self.polls >= self.n  # the job polls once a step


def _losses(workdir):
  return {r["step"]: r["train_loss"] for r in read_jsonl(os.path.join(workdir, "logs", "metrics.jsonl"))}


def test_sft_loss_falls_and_exports(tiny_source, tmp_path):
  from fineflax.jobs import sft
  summary = sft.run(_config(tiny_source, num_steps=12), str(tmp_path))
  assert summary["status"] == "completed" and summary["step"] == 12 and summary["exit_code"] == 0
  assert all(src["examples"] > 0 and src["rows"] > 0 for src in summary["data"]["sources"])  # per-source accounting
  losses = _losses(str(tmp_path))
  assert np.mean([losses[s] for s in (11, 12)]) < np.mean([losses[s] for s in (1, 2)]) - 1.0
  rows = read_jsonl(os.path.join(str(tmp_path), "logs", "metrics.jsonl"))
  assert any("eval_loss" in r for r in rows) and any("tokens_per_s" in r for r in rows)
  assert os.path.exists(os.path.join(summary["adapter"], "adapter_model.safetensors"))
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "logs"))


def test_resume_matches_uninterrupted_run(tiny_source, tmp_path, monkeypatch):
  from fineflax.jobs import sft
  sft.run(_config(tiny_source, num_steps=6), str(tmp_path / "full"))
  from fineflax.train import loop
  monkeypatch.setattr(loop, "StopRequested", StopAfter(3))
  s = sft.run(_config(tiny_source, num_steps=6), str(tmp_path / "resumed"))
  assert s["status"] == "stopped by SIGTERM at step 3" and s["exit_code"] == 143
  monkeypatch.undo()
  s = sft.run(_config(tiny_source, num_steps=6), str(tmp_path / "resumed"))
  assert s["status"] == "completed"
  full, resumed = _losses(str(tmp_path / "full")), _losses(str(tmp_path / "resumed"))
  assert sorted(resumed) == [1, 2, 3, 4, 5, 6]
  for step in range(1, 7):
    np.testing.assert_allclose(resumed[step], full[step], rtol=1e-5, err_msg=f"step {step}")


@pytest.mark.long
def test_damaged_latest_checkpoint_resumes_from_the_previous_one(tiny_source, tmp_path, monkeypatch, capsys):
  """Regression (issue 36): garbage in the latest step's JSON blocked resume with a raw JSONDecodeError."""
  from fineflax.jobs import sft
  from fineflax.train import loop
  monkeypatch.setattr(loop, "StopRequested", StopAfter(4))
  assert sft.run(_config(tiny_source, num_steps=6), str(tmp_path))["step"] == 4  # checkpoints at 2 and 4
  monkeypatch.undo()
  with open(tmp_path / "checkpoints" / "4" / "meta" / "metadata", "w") as f:
    f.write("{garbage")
  capsys.readouterr()
  s = sft.run(_config(tiny_source, num_steps=6), str(tmp_path))
  out = capsys.readouterr().out
  assert s["status"] == "completed" and s["step"] == 6, s
  assert "checkpoint step 4 in" in out and "JSONDecodeError" in out and "resuming from step 2 of 6" in out
  assert os.path.isdir(tmp_path / "checkpoints.unreadable" / "4")  # moved aside when step 4 was saved again, kept


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tiny_source, tmp_path, monkeypatch, capsys):
  from fineflax.jobs import sft
  real = sft.make_sft_fns

  def poisoned(*args, **kwargs):
    train, evaluate = real(*args, **kwargs)
    def train_nan(state, base, batch):
      new_state, metrics = train(state, base, batch)
      if int(new_state["step"]) >= 5:
        metrics = dict(metrics, loss=metrics["loss"] * float("nan"))
      return new_state, metrics
    return train_nan, evaluate

  monkeypatch.setattr(sft, "make_sft_fns", poisoned)
  s = sft.run(_config(tiny_source, num_steps=6), str(tmp_path))  # num_steps as above: the same compiled step
  assert s["status"] == "stopped: non-finite loss nan at step 5"
  assert "the last good checkpoint is step 4" in capsys.readouterr().out
  assert json.load(open(tmp_path / "summary.json"))["step"] == 4


@pytest.mark.fast
def test_stop_requested_catches_sigterm():
  from fineflax.train.signals import StopRequested
  with StopRequested() as stop:
    assert not stop
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop and stop.signal_name == "SIGTERM"


def test_sft_with_micro_batch_tokens_packs_the_step_and_the_loss_falls(tiny_source, tmp_path):
  """train.micro_batch_tokens: two data batches a step re-packed into 96-token rows (lora dropout on:
  one key per micro-batch); a budget below data.max_length is refused at start."""
  from fineflax.config_checks import ConfigError
  from fineflax.jobs import sft
  c = _config(tiny_source, num_steps=8, **{"train.micro_batch_tokens": 96, "data.grad_accum": 2})
  summary = sft.run(c, str(tmp_path))
  assert summary["status"] == "completed" and summary["step"] == 8
  losses = _losses(str(tmp_path))
  assert np.mean([losses[s] for s in (7, 8)]) < np.mean([losses[s] for s in (1, 2)]) - 0.5
  with pytest.raises(ConfigError, match=r"config.train.micro_batch_tokens=32: 0 \(off\) or at least data.max_length=64"):
    sft.run(_config(tiny_source, **{"train.micro_batch_tokens": 32}), str(tmp_path / "refused"))
