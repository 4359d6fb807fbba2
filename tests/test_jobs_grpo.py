"""The GRPO-family job on a tiny model: GRPO runs and resumes; LUFFY rows carry traces; ExGRPO replays."""
import os
import signal

import jax
import numpy as np
import pytest

from experiments.common import apply_overrides, load_config
from fineflax.jobs import grpo


def _config(source, objective="grpo", **over):
  c = load_config("configs/grpo_arith.py", "smoke")
  c.model.source = source
  c.rl.objective = objective
  c.rl.max_new_tokens = 8
  c.task.num_eval = 4
  c.task.num_train = 64
  apply_overrides(c, over)
  return c


def test_stop_request_right_after_a_checkpointed_evaluation(tiny_smol, tmp_path, monkeypatch):
  """SIGTERM during step 2 (an evaluation step, so already checkpointed): the run stops after step 2,
  exports, and a rerun resumes at step 3."""
  train_step = grpo.Trainer.train_step

  def train_step_then_sigterm(self, *args):
    out = train_step(self, *args)
    if int(self.state["step"]) == 2:
      os.kill(os.getpid(), signal.SIGTERM)
    return out

  monkeypatch.setattr(grpo.Trainer, "train_step", train_step_then_sigterm)
  c = _config(tiny_smol, "grpo", **{"num_steps": "5", "eval_every": "2"})
  hist = grpo.run(c, str(tmp_path))["history"]
  assert [h["step"] for h in hist] == [0, 1, 2] and "eval_accuracy" in hist[-1]
  assert os.path.exists(tmp_path / "history.json")
  monkeypatch.setattr(grpo.Trainer, "train_step", train_step)
  assert [h["step"] for h in grpo.run(c, str(tmp_path))["history"]][0] == 3


@pytest.fixture(scope="module")
def luffy_trainer(tiny_smol):
  return grpo.Trainer(_config(tiny_smol, "luffy"))


def test_grpo_job_runs_and_resumes_with_its_buffer(tiny_smol, tmp_path):
  out = grpo.run(_config(tiny_smol, "grpo"), str(tmp_path))
  hist = out["history"]
  assert [h["step"] for h in hist] == [0, 1, 2]
  assert "eval_accuracy" in hist[0] and "eval_accuracy" in hist[-1]
  for key in ("loss", "clip_frac", "entropy", "reward_mean", "zero_variance_groups", "time_rollout_s",
              "completion_length"):
    assert any(key in h for h in hist), key
  assert os.path.exists(tmp_path / "adapter" / "adapter_config.json")
  c = _config(tiny_smol, "grpo")
  c.num_steps = 3  # resume: one more step after the saved two
  hist2 = grpo.run(c, str(tmp_path))["history"]
  assert [h["step"] for h in hist2] == [3]


def test_luffy_groups_hold_one_solver_trace(luffy_trainer):
  tr = luffy_trainer
  train = grpo.generate_problems(3, "train", (1, 2), 0)
  rows = tr.rollout(train[:2], [None, None], jax.random.PRNGKey(0))
  K = tr.rl.group_size
  assert len(rows["completion"]) == 2 * K
  for g, p in enumerate(train[:2]):
    group = range(g * K, (g + 1) * K)
    off = [i for i in group if rows["off_policy"][i]]
    assert len(off) == 1
    i = off[0]
    want = grpo.trace_ids(tr.tok, p.solution, tr.eos)[:tr.rl.max_new_tokens]
    assert rows["completion"][i] == want and rows["loss_mask"][i] == [1.0] * len(want)
    assert all(not rows["off_policy"][j] for j in group if j != i)


def test_assistant_prefix_is_prefilled_and_stripped_from_traces(tiny_smol):
  tr = grpo.Trainer(_config(tiny_smol, "luffy", **{"task.assistant_prefix": "<think>\n"}))
  p = grpo.generate_problems(1, "train", (1, 2), 0)[0]
  plain = grpo.prompt_ids(tr.tok, tr.config.task.system_prompt, p.question)
  assert tr.prompt(p)[:len(plain)] == plain and tr.tok.decode(tr.prompt(p)[len(plain):]) == "<think>\n"
  rows = tr.rollout([p], [None], jax.random.PRNGKey(0))
  trace = rows["completion"][rows["off_policy"].index(True)]
  stripped = tr.tok(p.solution[len("<think>\n"):], add_special_tokens=False)["input_ids"]
  assert p.solution.startswith("<think>\n") and trace == stripped[:tr.rl.max_new_tokens]


def test_exgrpo_buffers_successes_and_replays_lowest_entropy(tiny_smol, monkeypatch):
  tr = grpo.Trainer(_config(tiny_smol, "exgrpo", **{"rl.exgrpo_threshold": -1.0}))
  K = tr.rl.group_size
  train = grpo.generate_problems(4, "train", (1, 2), 0)
  rows = tr.rollout(train[:2], [None, None], jax.random.PRNGKey(0))
  rewards = np.zeros(2 * K, np.float32)
  rewards[[0, 1]] = 1.0  # question 0: 2 of K correct; question 1: none
  solve = tr.update_buffer([0, 1], rows, rewards)
  assert solve == pytest.approx(2 / (2 * K))
  assert len(tr.buffer) == 1 and tr.buffer.buckets() == {2: ["0"]}
  probs, qids, idx = tr.choose(train, np.arange(4), 0, np.random.default_rng(0))
  assert qids[0] == "0" and idx[0] == 0 and qids[1:] == [None] * (len(qids) - 1)
  stored = tr.buffer.questions["0"]["trajectories"]
  ent = tr.mean_entropy(tr.buffer.questions["0"]["prompt"], stored)
  best = stored[int(np.argmin(ent))]
  rows2 = tr.rollout(probs[:1], qids[:1], jax.random.PRNGKey(1))
  replayed = [i for i in range(K) if rows2["off_policy"][i]]
  assert len(replayed) == 1
  r = replayed[0]
  assert rows2["completion"][r] == best.tokens.tolist()
  np.testing.assert_array_equal(np.float32(rows2["behaviour_logp"][r]), best.logp)
  metrics = tr.train_step(rows2, np.linspace(0, 1, K).astype(np.float32), np.ones(1, bool))
  assert np.isfinite(metrics["loss"]) and "off_pg_loss" in metrics


def test_dapo_overlong_punishment_shapes_the_reward_not_the_solve_rate(tiny_smol, tmp_path):
  # a random tiny model never stops: every sample uses all 8 tokens, deep in the 4-token buffer
  c = _config(tiny_smol, "grpo", **{"rl.overlong_buffer": 4, "num_steps": 1})
  hist = grpo.run(c, str(tmp_path))["history"]
  assert hist[-1]["reward_mean"] < -0.9 and hist[-1]["solve_rate"] == 0.0


def test_dapo_dynamic_sampling_refills_only_while_groups_lack_variance(tiny_smol):
  from fineflax.rewards import REWARDS, register
  if "upper_share" not in REWARDS:
    register("upper_share")(lambda prompt, completion, **e: sum(ch.isupper() for ch in completion)
                            / max(len(completion), 1))
  c = _config(tiny_smol, "grpo", **{"rl.dynamic_sampling": True, "rl.max_refill_rounds": 2})
  tr = grpo.Trainer(c)
  train, order = grpo.generate_problems(16, "train", (1, 2), 0), np.arange(16)
  P, K = c.rl.prompts_per_step, c.rl.group_size
  flat = tr.collect(train, order, 0, jax.random.PRNGKey(0), np.random.default_rng(0))  # reward 0 everywhere
  assert len(flat["rows"]["completion"]) == 3 * P * K and flat["zero_var"].all()
  c.rewards = {"upper_share": 1.0}
  varied = tr.collect(train, order, 0, jax.random.PRNGKey(0), np.random.default_rng(0))
  assert len(varied["rows"]["completion"]) == P * K and not varied["zero_var"].any()
