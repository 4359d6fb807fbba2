"""Training infrastructure: orbax checkpoints (round trip, last-N + best retention, failed writes), metrics."""
import errno
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fineflax.train.checkpoint import Checkpointer, CheckpointUnreadable
from fineflax.train.metric_writer import MetricWriter, read_jsonl
from fineflax.train.optim import make_optimizer, make_schedule
from fineflax.train.state import init_state


def _state(seed=0):
  lora = {"q": {"a": jax.random.normal(jax.random.PRNGKey(seed), (2, 8, 4)), "b": jnp.zeros((2, 4, 8))}}
  return init_state(lora, optax.adamw(1e-3), seed)


def test_checkpoint_round_trip(tmp_path):
  ckpt = Checkpointer(str(tmp_path / "c"))
  state = _state()
  state["opt_state"] = optax.adamw(1e-3).update(state["params"], state["opt_state"], state["params"])[1]
  meta = {"data": {"mixture": {"step": 17, "counts": [3, 4]}}, "note": "x"}
  assert ckpt.save(5, state, meta)
  restored, meta2 = Checkpointer(str(tmp_path / "c")).restore(_state(seed=1))
  assert meta2 == meta
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), state, restored)


def test_saving_a_saved_step_again_keeps_the_first(tmp_path):
  ckpt = Checkpointer(str(tmp_path / "c"))
  assert ckpt.save(5, _state(0), {"n": 1})
  assert ckpt.save(5, _state(1), {"n": 2})  # e.g. a stop request right after the periodic save
  restored, meta = ckpt.restore(_state(2))
  assert meta == {"n": 1}
  np.testing.assert_array_equal(np.asarray(restored["params"]["q"]["a"]), np.asarray(_state(0)["params"]["q"]["a"]))


def test_keeps_last_n_and_best(tmp_path):
  ckpt = Checkpointer(str(tmp_path / "c"), keep_last=2, keep_best=1, best_metric="eval_loss")
  losses = {1: 3.0, 2: 1.0, 3: 2.0, 4: 2.5, 5: 2.7}
  for step, loss in losses.items():
    ckpt.save(step, _state(), {}, metrics={"eval_loss": loss})
  assert ckpt.all_steps() == [2, 4, 5]  # best (step 2) + the last two


def test_failed_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
  ckpt = Checkpointer(str(tmp_path / "c"))
  assert ckpt.save(1, _state(), {"ok": True})
  def full_disk(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(ckpt.manager, "save", full_disk)
  assert not ckpt.save(2, _state(seed=3), {"ok": False})
  assert ckpt.latest_step() == 1
  _, meta = Checkpointer(str(tmp_path / "c")).restore(_state())
  assert meta == {"ok": True}


def test_metric_writer_jsonl_and_tensorboard(tmp_path):
  w = MetricWriter(str(tmp_path))
  w.write_scalars(1, {"loss": 2.5, "acc": 0.25})
  w.write_scalars(2, {"loss": float("nan")})
  w.close()
  rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert rows[0]["step"] == 1 and rows[0]["loss"] == 2.5 and rows[1]["loss"] == "nan"
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path))


def test_metric_writer_keeps_torch_out_of_a_process_without_it(tmp_path):
  """tensorboardX is imported without torch (a job process starts seconds faster); the events are written,
  and torch still imports afterwards."""
  code = textwrap.dedent(f"""
      import glob, sys
      from fineflax.train.metric_writer import MetricWriter
      w = MetricWriter({str(tmp_path)!r})
      w.write_scalars(1, {{"reward_mean": 0.5}})
      w.write_text(1, "sample", "hello")
      w.close()
      print("torch" in sys.modules, b"reward_mean" in open(glob.glob({str(tmp_path)!r} + "/events.*")[0], "rb").read())
      import torch
      print(torch.zeros(2).sum().item())
  """)
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0 and r.stdout.split() == ["False", "True", "0.0"], r.stdout + r.stderr[-2000:]


def test_schedule_warmup_then_cosine():
  from ml_collections import ConfigDict
  cfg = ConfigDict(dict(learning_rate=1e-3, warmup_steps=10, num_steps=110, end_lr_ratio=0.1,
                        weight_decay=0.0, b1=0.9, b2=0.999, grad_clip=1.0))
  s = make_schedule(cfg)
  assert float(s(0)) == 0.0 and abs(float(s(10)) - 1e-3) < 1e-9
  assert abs(float(s(60)) - (1e-4 + 0.5 * 9e-4)) < 1e-8  # cosine midpoint
  assert abs(float(s(110)) - 1e-4) < 1e-9
  grads = {"w": jnp.full((4,), 100.0)}
  opt = make_optimizer(cfg)
  upd, _ = opt.update(grads, opt.init(grads), grads)
  assert np.all(np.isfinite(np.asarray(upd["w"])))


def _damage(step_dir, how):
  """Garbage JSON in the meta item, or every OCDBT manifest truncated to 3 bytes."""
  if how == "garbage_json":
    with open(os.path.join(step_dir, "meta", "metadata"), "w") as f:
      f.write("{garbage")
  else:
    for root, _, files in os.walk(os.path.join(step_dir, "state")):
      for name in files:
        if name == "manifest.ocdbt":
          os.truncate(os.path.join(root, name), 3)


@pytest.mark.parametrize("how", ["garbage_json", "truncated_file"])
def test_damaged_latest_checkpoint_falls_back_to_the_previous_step(tmp_path, capsys, how):
  """Regression (issue 36): a damaged latest step blocked resume with a raw traceback."""
  ckpt = Checkpointer(str(tmp_path / "c"), keep_last=3)
  for step in (1, 2, 3):
    assert ckpt.save(step, _state(seed=step), {"step": step})
  ckpt.close()
  _damage(str(tmp_path / "c" / "3"), how)
  capsys.readouterr()
  ckpt = Checkpointer(str(tmp_path / "c"), keep_last=3)
  step, restored, meta = ckpt.restore_newest(_state(seed=9))
  assert (step, meta) == (2, {"step": 2})
  np.testing.assert_array_equal(np.asarray(restored["params"]["q"]["a"]), np.asarray(_state(2)["params"]["q"]["a"]))
  lines = [l for l in capsys.readouterr().out.splitlines() if "step 3" in l]
  assert len(lines) == 1 and str(tmp_path / "c") in lines[0] and "skipped" in lines[0]
  assert ("JSONDecodeError" if how == "garbage_json" else "manifest") in lines[0]
  assert ckpt.all_steps() == [1, 2, 3] and os.path.isdir(tmp_path / "c" / "3")  # nothing deleted
  assert ckpt.save(3, _state(seed=30), {"step": "3 again"})  # the damaged step is moved aside, not kept
  assert os.path.isdir(tmp_path / "c.unreadable" / "3")
  assert Checkpointer(str(tmp_path / "c")).restore_newest(_state())[::2] == (3, {"step": "3 again"})


def test_no_restorable_checkpoint_is_one_clear_error(tmp_path):
  ckpt = Checkpointer(str(tmp_path / "c"))
  for step in (1, 2):
    assert ckpt.save(step, _state(), {"step": step})
  ckpt.close()
  for step in (1, 2):
    _damage(str(tmp_path / "c" / str(step)), "garbage_json")
  with pytest.raises(CheckpointUnreadable) as e:
    Checkpointer(str(tmp_path / "c")).restore_newest(_state())
  message = str(e.value)
  assert "\n" not in message and str(tmp_path / "c") in message and "step 2" in message and "step 1" in message
  assert Checkpointer(str(tmp_path / "empty")).restore_newest(_state()) is None


def test_checkpoint_from_before_the_params_rename_restores(tmp_path):
  """A state saved as {"lora", ...} (the name before "params") restores into today's {"params", ...}."""
  old = _state(3)
  old = {("lora" if k == "params" else k): v for k, v in old.items()}
  assert Checkpointer(str(tmp_path / "c")).save(4, old, {"n": 1})
  restored, meta = Checkpointer(str(tmp_path / "c")).restore(_state(0))
  assert sorted(restored) == sorted(_state(0)) and meta == {"n": 1}
  np.testing.assert_array_equal(np.asarray(restored["params"]["q"]["a"]), np.asarray(old["lora"]["q"]["a"]))
