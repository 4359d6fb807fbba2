"""Asynchronous RL (`rl.async_steps`, fineflax/rl/async_rollouts.py) on the arithmetic env with a tiny model:
k = 0 is the synchronous loop bit for bit; with k = 1 the update at step t reads rollouts of step t - 1's
starting weights (each batch's behaviour log-probs are those weights' log-probs of its tokens, not the newer
ones'); an interrupted async run resumes to the uninterrupted run's weights; LUFFY runs async; ExGRPO
replays async; PPO runs async; bad rollout groups are named."""

import jax
import numpy as np
import pytest

from fineflax.config_checks import ConfigError
from fineflax.jobs import rl as rl_job
from fineflax.testing.signals import sigterm_after
from fineflax.jobs.resolve import load_config
from fineflax.rl.async_rollouts import split_devices


def _config(source, preset="", **over):
  over = {"model.source": source, "rl.max_new_tokens": 8, "task.num_eval": 4, "task.num_train": 64,
          "eval_batch_size": 4, "eval_at_start": False, "optimizer.learning_rate": 0.05, "optimizer.warmup_steps": 0,
          # a random model solves nothing (advantages 0): the entropy bonus moves the weights every update, and
          # unmasked truncated rows keep tokens in the loss
          "rl.entropy_coef": 0.5, "rl.mask_truncated": False, **over}
  return load_config(f"configs/grpo_arith.py:smoke{',' + preset if preset else ''}",
                     [f"{k}={v}" for k, v in over.items()])


def _params(state):
  return [np.asarray(x) for x in jax.tree.leaves(state["params"])]


def _recording(job):
  """Wraps job.learner.update: [(params before the update, its batch)] per call."""
  calls, update = [], job.learner.update

  def recorded(state, batch):
    calls.append((jax.tree.map(np.asarray, state["params"]), dict(batch)))
    return update(state, batch)
  job.learner.update = recorded
  return calls


def test_async_zero_is_the_synchronous_loop_bit_for_bit(tiny_smol, tmp_path):
  """The job's run with async_steps=0 against the loop written out from its parts: collect batch t with
  the current weights (its questions and rng), then update on it."""
  c = _config(tiny_smol, num_steps=2, **{"rl.async_steps": 0})
  out = rl_job.run(c, str(tmp_path))
  job = rl_job.RLJob(c)
  learner, rl, state = job.learner, job.rl, job.learner.state
  for step in (1, 2):
    g = learner.collect(state["params"], job.env, job.env.train_items, job.order, (step - 1) * rl.prompts_per_step,
                        jax.random.fold_in(job.rng, step), c.rewards)
    state, _ = learner.update(state, learner.groups_batch(g))
  for a, b in zip(_params(out["job"].learner.state), _params(state)):
    np.testing.assert_array_equal(a, b)
  assert "policy_version" not in out["history"][-1]
  for key in ("mismatch_kl", "mismatch_max_abs_dlogp", "is_weight_mean", "is_weight_max", "is_masked_frac"):
    assert key in out["history"][-1], key
  # f32 engine vs learner forward on the same weights: the mismatch is float noise
  assert out["history"][-1]["mismatch_max_abs_dlogp"] < 1e-3


def test_async_one_step_reads_the_previous_weights_rollouts(tiny_smol, tmp_path):
  """k=1, 3 steps: versions 0, 0, 1; each batch's behaviour log-probs equal its version's log-probs of its
  tokens and differ from the weights the update starts from (steps 2, 3)."""
  c = _config(tiny_smol, num_steps=3, eval_every=3, **{"rl.async_steps": 1, "rl.importance": "tis"})
  job = rl_job.RLJob(c)
  calls = _recording(job)
  out = rl_job.train_and_export(job, c, str(tmp_path), desc="async")
  hist = [h for h in out["history"] if h["step"] > 0]
  assert [h["policy_version"] for h in hist] == [0, 0, 1] and [h["staleness"] for h in hist] == [0, 1, 1]
  assert hist[-1]["staleness_hist_0"] == 1 and hist[-1]["staleness_hist_1"] == 2
  learner = job.learner
  logp = lambda params, batch: np.asarray(learner.logp_fn(params, learner.base, batch)[0])
  before = [p for p, _ in calls] + [jax.tree.map(np.asarray, learner.state["params"])]  # version v = before[v]
  for t, h in zip((1, 2, 3), hist):
    batch = calls[t - 1][1]
    m = batch["mask"] > 0
    behaviour = batch["behaviour_logp"][m]
    made = np.abs(logp(before[int(h["policy_version"])], batch)[m] - behaviour).max()
    assert made < 1e-3, (t, made)
    if t > 1:  # the weights this update starts from did not make the batch
      assert np.abs(logp(before[t - 1], batch)[m] - behaviour).max() > 10 * max(made, 1e-5), t
  assert hist[-1]["mismatch_max_abs_dlogp"] > 10 * hist[0]["mismatch_max_abs_dlogp"]


def test_an_interrupted_async_run_resumes_to_the_same_weights(tiny_smol, tmp_path, monkeypatch, capsys):
  """SIGTERM after step 2 of 3 (k=1: batch 3 is in flight, made from version 1, and saved); the resumed
  run ends with the uninterrupted run's weights bit for bit."""
  c = _config(tiny_smol, num_steps=3, eval_every=3, **{"rl.async_steps": 1})
  whole = rl_job.run(c, str(tmp_path / "whole"))
  step = rl_job.RLJob.step
  monkeypatch.setattr(rl_job.RLJob, "step", sigterm_after(step, 2))
  stopped = rl_job.run(c, str(tmp_path / "cut"))
  assert stopped["exit_code"] == 143
  monkeypatch.setattr(rl_job.RLJob, "step", step)
  resumed = rl_job.run(c, str(tmp_path / "cut"))
  assert "resuming from step 2 of 3" in capsys.readouterr().out
  assert resumed["history"][-1]["policy_version"] == 1 and resumed["history"][-1]["staleness_hist_1"] == 2
  for a, b in zip(_params(whole["job"].learner.state), _params(resumed["job"].learner.state)):
    np.testing.assert_array_equal(a, b)
  changed = _config(tiny_smol, num_steps=3, eval_every=3, **{"rl.async_steps": 2})
  with pytest.raises(Exception, match="async_steps"):
    rl_job.run(changed, str(tmp_path / "cut"))


def test_luffy_runs_async(tiny_smol, tmp_path):
  c = _config(tiny_smol, "luffy", num_steps=2, **{"rl.async_steps": 1, "rl.importance": "mis"})
  hist = rl_job.run(c, str(tmp_path))["history"]
  assert [h["policy_version"] for h in hist] == [0, 0] and np.isfinite(hist[-1]["loss"])
  assert 0.0 <= hist[-1]["is_masked_frac"] <= 1.0 and "off_pg_loss" in hist[-1]


@pytest.mark.fast
def test_rollout_groups_are_checked():
  devices = list(range(4))  # split_devices reads only their count and order
  c = load_config("configs/grpo_arith.py:smoke", ["mesh.rollout=1", "rl.async_steps=1"])
  assert split_devices(c, devices) == ([0, 1, 2], [3])
  for over, match in ((["mesh.rollout=1"], "needs config.rl.async_steps"),
                      (["mesh.rollout=4", "rl.async_steps=1"], "leaves no learner device"),
                      (["mesh.rollout=-1"], "config.mesh.rollout=-1"),
                      (["mesh.rollout=1", "rl.async_steps=1", "mesh.model=2"], "tensor-parallel")):
    with pytest.raises(ConfigError, match=match):
      split_devices(load_config("configs/grpo_arith.py:smoke", over), devices)


GROUP = """
import sys, jax, numpy as np
from fineflax.jobs import rl as rl_job
from fineflax.jobs.resolve import load_config
from fineflax.rl import async_rollouts as A
assert jax.device_count() == 2, jax.devices()
over = {"model.source": sys.argv[1], "rl.max_new_tokens": 8, "task.num_eval": 4, "task.num_train": 64,
        "eval_batch_size": 4, "eval_at_start": False, "optimizer.learning_rate": 0.05, "optimizer.warmup_steps": 0,
        "rl.entropy_coef": 0.5, "rl.mask_truncated": False, "num_steps": 3, "eval_every": 3,
        "rl.async_steps": 1, "mesh.rollout": 1}
c = load_config("configs/grpo_arith.py:smoke", [f"{k}={v}" for k, v in over.items()])
job = rl_job.RLJob(c)
learner, group = job.learner, job.pipeline.group
assert list(learner.mesh.devices.flat) == [jax.devices()[0]] and group.devices == [jax.devices()[1]]
where, calls, policy, update = [], [], group.policy, learner.update
def placed(params):  # the rollout policy's weights: all on the rollout device
  p = policy(params)
  where.append({d for x in jax.tree.leaves((p.base, p.lora)) for d in x.devices()})
  return p
def recorded(state, batch):
  calls.append((jax.tree.map(np.asarray, state["params"]), dict(batch)))
  return update(state, batch)
group.policy, learner.update = placed, recorded
out = rl_job.train_and_export(job, c, sys.argv[2], desc="group")
hist = [h for h in out["history"] if h["step"] > 0]
assert [h["policy_version"] for h in hist] == [0, 0, 1], hist
assert len(where) == 3 and all(w == {jax.devices()[1]} for w in where), where  # batches 1-3 on the group
before = [p for p, _ in calls] + [jax.tree.map(np.asarray, learner.state["params"])]
logp = lambda params, batch: np.asarray(learner.logp_fn(params, learner.base, batch)[0])
for t, h in zip((1, 2, 3), hist):
  batch = calls[t - 1][1]
  m = batch["mask"] > 0
  made = np.abs(logp(before[int(h["policy_version"])], batch)[m] - batch["behaviour_logp"][m]).max()
  newer = np.abs(logp(before[t - 1], batch)[m] - batch["behaviour_logp"][m]).max()
  assert made < 1e-3 and (t == 1 or newer > 10 * max(made, 1e-5)), (t, made, newer)
print("GROUP OK", [h["time_wait_s"] for h in hist])
"""


def test_a_rollout_group_decodes_on_its_device_with_the_previous_weights(tiny_smol, tmp_path):
  """2 forced CPU devices, config.mesh.rollout=1, k=1: the learner trains on device 0, every batch
  decodes on device 1 from weights copied there, and step t's batch holds step t - 1's starting weights'
  log-probs (not step t's)."""
  from fineflax.testing.devices import run_script
  r = run_script(GROUP, tiny_smol, str(tmp_path / "run"), devices=2, timeout=1200)
  assert "GROUP OK" in r.stdout, r.stdout[-3000:] + r.stderr[-5000:]


@pytest.mark.fast
@pytest.mark.parametrize("k", [1, 2, 3])
def test_pipeline_versions_bound_staleness_and_survive_a_checkpoint(k):
  """Model-free: params are the version number itself; batch s of the pipeline holds the version it was made
  from, the update at step t reads version max(t - 1 - k, 0) and after a state_dict round trip (a resume) the
  same batches come back."""
  from fineflax.rl.async_rollouts import AsyncRollouts
  made, read = {}, []

  def collect(params, step, policy, entropy_fn):
    made[step] = params
    return {"step": step, "from": params}

  def update(state, groups):
    read.append(groups["from"])
    return {"params": state["params"] + 1}, {"loss": 0.0}

  n, state, hist = 7, {"params": 0}, []
  pipe = AsyncRollouts(k, n, collect)
  for t in range(1, n + 1):
    if t == 4:  # resume: a fresh pipeline from the saved one's state
      saved = pipe.state_dict()
      pipe = AsyncRollouts(k, n, collect)
      pipe.load_state_dict(saved)
    state, m = pipe.step(state, t, lambda g: None, update)
    hist.append(m)
  assert read == [max(t - 1 - k, 0) for t in range(1, n + 1)]
  assert [m["staleness"] for m in hist] == [min(t - 1, k) for t in range(1, n + 1)]
  assert sorted(made) == list(range(1, n + 1))  # every batch generated once, none past num_steps
  assert sum(hist[-1][f"staleness_hist_{j}"] for j in range(k + 1)) == n and hist[-1][f"staleness_hist_{k}"] == n - k


def test_exgrpo_replays_under_async(tiny_smol, tmp_path):
  """ExGRPO with k=1: successes of the stale batches enter the buffer and are replayed from step 2 on (threshold
  0; a reward a random model earns on about half its rows: an even completion length in characters)."""
  import ml_collections
  from fineflax.rewards import REWARDS, register
  if "even_length" not in REWARDS:
    register("even_length")(lambda prompt, completion, **e: float(len(completion) % 2 == 0))
  c = _config(tiny_smol, "exgrpo", num_steps=3, eval_every=3, **{"rl.async_steps": 1, "rl.exgrpo.threshold": 0.0})
  with c.unlocked():
    c.rewards = ml_collections.ConfigDict({"even_length": 1.0})
  hist = [h for h in rl_job.run(c, str(tmp_path))["history"] if h["step"] > 0]
  assert [h["policy_version"] for h in hist] == [0, 0, 1]
  assert hist[0]["replay_share"] == 0 and max(h["replay_share"] for h in hist[1:]) > 0
  assert hist[-1]["buffer_questions"] > 0 and all(np.isfinite(h["loss"]) for h in hist)


def test_ppo_runs_async(tiny_smol, tmp_path):
  """PPO (a LoRA critic, GAE) with k=1: the critic values the stale batch at update time."""
  c = _config(tiny_smol, "ppo", num_steps=2, **{"rl.async_steps": 1})
  hist = [h for h in rl_job.run(c, str(tmp_path))["history"] if h["step"] > 0]
  assert [h["policy_version"] for h in hist] == [0, 0] and [h["staleness"] for h in hist] == [0, 1]
  assert all(np.isfinite(h["loss"]) and np.isfinite(h["vf_loss"]) for h in hist)
  assert hist[1]["is_weight_max"] <= c.rl.importance_cap + 1e-6  # the default importance: auto = tis
