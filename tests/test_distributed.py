"""Multi-process runs: `config.distributed` settings, and a GRPO smoke step in 2 processes on localhost
(JAX CPU collectives, one device each) that agrees with 1 process of 2 devices; only process 0 writes."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import ml_collections
import pytest

from fineflax.config_checks import ConfigError
from fineflax.testing.devices import ROOT, cpu_devices_env
from fineflax.train.distributed import settings

WORKER = textwrap.dedent("""
    import json, sys
    source, workdir, n, pid, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    from fineflax.jobs.resolve import load_config
    from fineflax.train import distributed
    over = {"model.source": source, "rl.max_new_tokens": 8, "task.num_eval": 4, "task.num_train": 16,
            "eval_batch_size": 4, "num_steps": 1, "eval_at_start": False,
            "lora.targets": "('q','v')"}  # 4 adapter tensors per layer, not 14: faster compiles, same parity
    if n > 1:
      over.update({"distributed.coordinator_address": f"localhost:{port}", "distributed.num_processes": n,
                   "distributed.process_id": pid})
    config = load_config("configs/grpo_arith.py:smoke", [f"{k}={v}" for k, v in over.items()])
    assert distributed.initialize(config.distributed) == (n > 1)
    import jax
    assert jax.device_count() == 2 and jax.process_count() == n, (jax.devices(), jax.process_count())
    from fineflax.jobs import rl
    out = rl.run(config, workdir)
    h = out["history"][-1]
    # the sampler splits the rows over every device of all processes: each process computes its half
    import jax.numpy as jnp
    from fineflax.sampling import SamplerSession
    from fineflax.mesh import make_mesh, shard_params
    mesh = make_mesh(data=2, fsdp=1)
    base, mc = out["job"].learner.base, out["job"].learner.model_config  # the run's base (loading it again cost ~4 s)
    sess = SamplerSession(shard_params(base, mesh), mc, max_total_len=6, temperature=1.0, rng=jax.random.key(3),
                          dtype=jnp.float32, eos_ids=(), mesh=mesh)
    sess.start([[5, 6, 7], [8, 9], [10], [11, 12, 13, 14]])
    local_rows = sum(s.data.shape[1] for s in sess.cache["k"].addressable_shards)
    assert local_rows * n == sess.cache["k"].shape[1] == 4, (local_rows, sess.cache["k"].shape)
    sess.decode(6)
    sampled = [list(map(int, r)) for r in sess.result().tokens]
    print("RESULT " + json.dumps({**{k: h[k] for k in ("loss", "grad_norm", "reward_mean", "eval_accuracy")},
                                  "sampled": sampled}))
""")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _spawn(args, devices):
  return subprocess.Popen([sys.executable, "-c", WORKER, *map(str, args)], cwd=ROOT,
                          env=cpu_devices_env(devices), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc):
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-3000:]
  return json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[7:])


@pytest.mark.long
def test_two_processes_agree_with_one(tiny_smol, tmp_path):
  port = _free_port()
  procs = [_spawn([tiny_smol, tmp_path / "two", 2, pid, port], devices=1) for pid in (0, 1)]
  one = _result(_spawn([tiny_smol, tmp_path / "one", 1, 0, 0], devices=2))
  r0, r1 = [_result(p) for p in procs]
  assert r0.pop("sampled") == r1.pop("sampled") == one.pop("sampled")  # same tokens, rows split 2 ways
  for k in one:
    assert r0[k] == pytest.approx(one[k], rel=1e-5, abs=1e-7), k
    assert r1[k] == pytest.approx(r0[k], rel=1e-6, abs=1e-8), k
  records = [json.loads(l) for l in open(tmp_path / "two" / "logs" / "metrics.jsonl")]
  assert [r["step"] for r in records] == [1]  # one writer, not two
  assert json.load(open(tmp_path / "two" / "summary.json"))["status"] == "completed"
  assert os.path.exists(tmp_path / "two" / "adapter" / "adapter_config.json")
  assert os.listdir(tmp_path / "two" / "checkpoints")


def _cfg(**kw):
  return ml_collections.ConfigDict(dict(dict(coordinator_address="", num_processes=0, process_id=-1), **kw))


def test_settings_from_config_environment_or_single_process():
  assert settings(_cfg(), env={}) is None
  assert settings(_cfg(), env={"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}) is None
  assert settings(_cfg(), env={"SLURM_JOB_ID": "7", "SLURM_NTASKS": "8"}) == {}
  full = _cfg(coordinator_address="h:1234", num_processes=2, process_id=1)
  assert settings(full, env={}) == {"coordinator_address": "h:1234", "num_processes": 2, "process_id": 1}
  with pytest.raises(ConfigError, match="distributed.process_id"):
    settings(_cfg(coordinator_address="h:1234", num_processes=2), env={})
  with pytest.raises(ConfigError, match="process_id=2 must be < num_processes=2"):
    settings(_cfg(coordinator_address="h:1234", num_processes=2, process_id=2), env={})


def test_processes_other_than_0_check_a_changed_config_but_write_nothing(tmp_path):
  from fineflax.jobs.resolve import load_config
  from fineflax.train.run_config import ConfigChanged, check_resumable
  config = load_config("configs/grpo_arith.py:smoke")
  check_resumable(config, str(tmp_path), write=False)
  assert not os.path.exists(tmp_path / "config.json")
  check_resumable(config, str(tmp_path))
  (tmp_path / "checkpoints" / "1").mkdir(parents=True)
  with pytest.raises(ConfigChanged, match="rl.group_size"):
    check_resumable(load_config("configs/grpo_arith.py:smoke", ["rl.group_size=3"]), str(tmp_path), write=False)
  check_resumable(load_config("configs/grpo_arith.py:smoke", ["rl.group_size=3", "resume=False"]), str(tmp_path),
                  write=False)
  assert os.path.exists(tmp_path / "checkpoints" / "1")  # only process 0 moves the old run aside
