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

from fineflax.train.checkpoint import Checkpointer
from fineflax.train.metric_writer import MetricWriter, read_jsonl
from fineflax.train.optim import make_optimizer, make_schedule
from fineflax.train.state import init_state


def _state(seed=0):
  lora = {"q": {"a": jax.random.normal(jax.random.PRNGKey(seed), (2, 8, 4)), "b": jnp.zeros((2, 4, 8))}}
  return init_state(lora, optax.adamw(1e-3), seed)


def test_checkpoint_round_trip(tmp_path):
  ckpt = Checkpointer(str(tmp_path / "c"))
  state = _state()
  state["opt_state"] = optax.adamw(1e-3).update(state["lora"], state["opt_state"], state["lora"])[1]
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
  np.testing.assert_array_equal(np.asarray(restored["lora"]["q"]["a"]), np.asarray(_state(0)["lora"]["q"]["a"]))


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
