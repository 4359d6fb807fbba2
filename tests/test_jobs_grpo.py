"""The RL job on the arithmetic env with a tiny model: GRPO runs and resumes; stop, NaN and failed-write
handling of the shared loop; LUFFY rows carry traces; ExGRPO buffers and replays; DAPO shaping/refill."""
import json
import os

import jax
import numpy as np
import pytest

from fineflax.envs.arithmetic import prompt_ids
from fineflax.envs.word_problems import generate_problems
from fineflax.jobs import rl as rl_job
from fineflax.testing.signals import sigterm_after
from fineflax.jobs.resolve import load_config
from fineflax.rl.collect import collect, rollout_groups
from fineflax.rl.order import EpochOrder
from fineflax.rl.update import rl_update, update_batch
from fineflax.train import checkpoint as ckpt_lib


def _config(source, preset="", **over):
  over = {"model.source": source, "rl.max_new_tokens": 8, "task.num_eval": 4, "task.num_train": 64,
          "eval_batch_size": 4, **over}
  return load_config(f"configs/grpo_arith.py:smoke{',' + preset if preset else ''}",
                     [f"{k}={v}" for k, v in over.items()])


def _steps(history):
  return [h["step"] for h in history]


def test_stop_request_right_after_a_checkpointed_evaluation(tiny_smol, tmp_path, monkeypatch, capsys):
  """SIGTERM during step 2 (an evaluation step, so already checkpointed): the run stops after step 2
  with exit code 143, exports, and a rerun announces and resumes at step 3. (num_steps=3 here, in the NaN
  test and in the resume below: the learning-rate schedule depends on num_steps, so equal num_steps
  compile the RL step once for the three, through the run's persistent compilation cache.)"""
  step = rl_job.RLJob.step
  monkeypatch.setattr(rl_job.RLJob, "step", sigterm_after(step, 2))
  c = _config(tiny_smol, num_steps=3, eval_every=2)
  out = rl_job.run(c, str(tmp_path))
  assert _steps(out["history"]) == [0, 1, 2] and "eval_accuracy" in out["history"][-1]
  assert out["exit_code"] == 143 and out["summary"]["status"] == "stopped by SIGTERM at step 2"
  assert os.path.exists(tmp_path / "history.json") and os.path.exists(tmp_path / "summary.json")
  monkeypatch.setattr(rl_job.RLJob, "step", step)
  out = rl_job.run(c, str(tmp_path))
  assert "resuming from step 2 of 3" in capsys.readouterr().out
  assert _steps(out["history"]) == [0, 1, 2, 3] and out["exit_code"] == 0


def test_grpo_job_runs_resumes_and_knows_when_it_is_complete(tiny_smol, tmp_path, capsys):
  out = rl_job.run(_config(tiny_smol), str(tmp_path))
  hist = out["history"]
  assert _steps(hist) == [0, 1, 2]
  assert "eval_accuracy" in hist[0] and "eval_accuracy" in hist[-1]
  for key in ("loss", "clip_frac", "entropy", "reward_mean", "zero_variance_groups", "time_rollout_s",
              "completion_length", "solve_rate"):
    assert key in hist[-1], key
  assert os.path.exists(tmp_path / "adapter" / "adapter_config.json")
  summary = json.load(open(tmp_path / "summary.json"))
  assert summary["status"] == "completed" and summary["final_metrics"]["eval_accuracy"] == hist[-1]["eval_accuracy"]
  mtime = os.path.getmtime(tmp_path / "adapter" / "adapter_model.safetensors")
  out = rl_job.run(_config(tiny_smol), str(tmp_path))  # nothing to do: nothing is regenerated
  assert "already complete at step 2 of 2" in capsys.readouterr().out
  assert os.path.getmtime(tmp_path / "adapter" / "adapter_model.safetensors") == mtime
  out = rl_job.run(_config(tiny_smol, num_steps=3), str(tmp_path))  # one more step after the saved two
  assert _steps(out["history"])[-1] == 3 and "resuming from step 2 of 3" in capsys.readouterr().out


def test_non_finite_loss_stops_at_the_last_good_checkpoint(tiny_smol, tmp_path, monkeypatch, capsys):
  step = rl_job.RLJob.step

  def nan_at_3(self, state, i):
    new_state, scalars = step(self, state, i)
    return new_state, dict(scalars, loss=float("nan")) if i == 3 else scalars

  monkeypatch.setattr(rl_job.RLJob, "step", nan_at_3)
  out = rl_job.run(_config(tiny_smol, num_steps=3, eval_every=2), str(tmp_path))
  assert out["summary"]["status"] == "stopped: non-finite loss nan at step 3"
  assert out["summary"]["step"] == 2 and out["exit_code"] == 1
  assert "the last good checkpoint is step 2" in capsys.readouterr().out
  assert int(out["job"].learner.state["step"]) == 2  # the poisoned update was discarded


def test_a_failed_checkpoint_write_is_survived(tiny_smol, tmp_path, monkeypatch):
  """One failed write (disk full) is logged and retried at the next save; the run completes."""
  real, calls = ckpt_lib.Checkpointer.save, []

  def save_fails_once(self, step, *a, **k):
    calls.append(step)
    return False if step == 1 else real(self, step, *a, **k)

  monkeypatch.setattr(ckpt_lib.Checkpointer, "save", save_fails_once)
  out = rl_job.run(_config(tiny_smol, num_steps=2, eval_every=1), str(tmp_path))
  assert calls == [1, 2] and out["summary"]["status"] == "completed"
  assert sorted(int(s) for s in os.listdir(tmp_path / "checkpoints") if s.isdigit()) == [2]


@pytest.fixture(scope="module")
def luffy_job(tiny_smol):
  return rl_job.RLJob(_config(tiny_smol, "luffy"))


def test_luffy_groups_hold_one_solver_trace(luffy_job):
  job = luffy_job
  train = generate_problems(3, "train", (1, 2), 0)
  rows, examples = rollout_groups(job.env, job.learner.policy(job.learner.state["params"]), train[:2], [None, None],
                                  jax.random.PRNGKey(0), group_size=job.rl.group_size, guidance=job.guidance)
  K = job.rl.group_size
  assert len(rows["completion"]) == len(examples) == 2 * K
  for g, p in enumerate(train[:2]):
    group = range(g * K, (g + 1) * K)
    off = [i for i in group if rows["off_policy"][i]]
    assert len(off) == 1
    i = off[0]
    want = job.learner.tok(p.solution, add_special_tokens=False)["input_ids"] + [job.learner.policy(None).eos_id]
    assert rows["completion"][i] == want[:job.rl.max_new_tokens] and rows["loss_mask"][i] == [1.0] * len(
        rows["completion"][i])
    assert all(not rows["off_policy"][j] for j in group if j != i)
    assert all(examples[j] == {"answer": str(p.answer)} for j in group)


def test_assistant_prefix_is_prefilled_and_stripped_from_traces(tiny_smol):
  job = rl_job.RLJob(_config(tiny_smol, "luffy", **{"task.assistant_prefix": "<think>\n"}))
  p = generate_problems(1, "train", (1, 2), 0)[0]
  plain = prompt_ids(job.learner.tok, job.config.task.system_prompt, p.question)
  prompt = job.env.prompt(p)
  assert prompt[:len(plain)] == plain and job.learner.tok.decode(prompt[len(plain):]) == "<think>\n"
  rows, _ = rollout_groups(job.env, job.learner.policy(None), [p], [None], jax.random.PRNGKey(0),
                           group_size=job.rl.group_size, guidance=job.guidance)
  trace = rows["completion"][rows["off_policy"].index(True)]
  stripped = job.learner.tok(p.solution[len("<think>\n"):], add_special_tokens=False)["input_ids"]
  assert p.solution.startswith("<think>\n") and trace == stripped[:job.rl.max_new_tokens]


def test_exgrpo_buffers_successes_and_replays_lowest_entropy(tiny_smol):
  job = rl_job.RLJob(_config(tiny_smol, "exgrpo", **{"rl.exgrpo.threshold": 0.0}))
  K, lora = job.rl.group_size, job.learner.state["params"]
  train = generate_problems(4, "train", (1, 2), 0)
  rows, _ = rollout_groups(job.env, job.learner.policy(lora), train[:2], [None, None], jax.random.PRNGKey(0),
                           group_size=K)
  rewards = np.zeros(2 * K, np.float32)
  rewards[[0, 1]] = 1.0  # question 0: 2 of K correct; question 1: none
  job.replay.record([0, 1], rows, rewards, rewards >= 1, K)
  job.replay.solve_rate = 2 / (2 * K)
  assert len(job.replay.buffer) == 1 and job.replay.buffer.buckets() == {2: ["0"]}
  assert job.replay.questions(job.rl.prompts_per_step) == ["0"]
  stored = job.replay.buffer.questions["0"]["trajectories"]
  entropy = lambda p, ts: job.learner.mean_entropy(lora, p, ts)
  best = stored[int(np.argmin(entropy(job.replay.buffer.questions["0"]["prompt"], stored)))]
  rows2, _ = rollout_groups(job.env, job.learner.policy(lora), train[:1], ["0"], jax.random.PRNGKey(1),
                            group_size=K, replay=job.replay, entropy_fn=entropy)
  replayed = [i for i in range(K) if rows2["off_policy"][i]]
  assert replayed == [K - 1]
  assert rows2["completion"][K - 1] == best.tokens.tolist()
  np.testing.assert_array_equal(np.float32(rows2["behaviour_logp"][K - 1]), best.logp)
  batch = update_batch(rows2, np.linspace(0, 1, K).astype(np.float32), np.ones(1, bool), group_size=K,
                       pad_id=job.learner.pad_id, max_new_tokens=job.rl.max_new_tokens, advantage_scale="group",
                       fields=job.learner.objective.batch_fields)
  _, metrics = rl_update(job.learner.state, job.learner.base, batch, step_fn=job.learner.step_fn, logp_fn=job.learner.logp_fn, beta=0.0,
                         num_iterations=1, on_policy=job.learner.on_policy)
  assert np.isfinite(metrics["loss"]) and "off_pg_loss" in metrics


def test_exgrpo_job_runs_and_resumes_with_its_buffer(tiny_smol, tmp_path):
  c = _config(tiny_smol, "exgrpo", **{"rl.exgrpo.threshold": 0.0})
  out = rl_job.run(c, str(tmp_path))
  saved = out["job"].replay.state_dict()
  c2 = _config(tiny_smol, "exgrpo", **{"rl.exgrpo.threshold": 0.0, "num_steps": 3})
  job = rl_job.RLJob(c2)
  from fineflax.train.checkpoint import Checkpointer
  ck = Checkpointer(str(tmp_path / "checkpoints"))
  _, meta = ck.restore(job.learner.state)
  ck.close()
  assert json.dumps(meta["job"]["replay"], sort_keys=True) == json.dumps(saved, sort_keys=True)


def test_dapo_overlong_punishment_shapes_the_reward_not_the_solve_rate(tiny_smol, tmp_path):
  # a random tiny model never stops: every sample uses all 8 tokens, deep in the 4-token buffer
  c = _config(tiny_smol, **{"rl.overlong_buffer": 4})  # 2 steps: the RL step compiled for the runs above
  hist = rl_job.run(c, str(tmp_path))["history"]
  assert hist[-1]["reward_mean"] < -0.9 and hist[-1]["solve_rate"] == 0.0


def test_dapo_dynamic_sampling_refills_only_while_groups_lack_variance(tiny_smol):
  from fineflax.rewards import REWARDS, register
  if "upper_share" not in REWARDS:
    register("upper_share")(lambda prompt, completion, **e: sum(ch.isupper() for ch in completion)
                            / max(len(completion), 1))
  c = _config(tiny_smol, "dapo", **{"rl.max_refill_rounds": 2})
  job = rl_job.RLJob(c)
  train, order = generate_problems(16, "train", (1, 2), 0), EpochOrder(16, 0)
  P, K = c.rl.prompts_per_step, c.rl.group_size
  policy = job.learner.policy(job.learner.state["params"])
  flat = collect(job.env, policy, train, order, 0, jax.random.PRNGKey(0), c.rl, c.rewards)  # reward 0
  assert len(flat.rows["completion"]) == 3 * P * K and flat.zero_var.all()
  varied = collect(job.env, policy, train, order, 0, jax.random.PRNGKey(0), c.rl, {"upper_share": 1.0})
  assert len(varied.rows["completion"]) == P * K and not varied.zero_var.any()
