"""End-to-end RL plumbing: after updates on a real rollout batch (tiny model, real sampler), each
completion's log-probability moves in the direction of its advantage.

Sampling, recorded log-probs, rows -> batch alignment, group advantages, the clipped loss's sign and the
LoRA update must all be right for the correlation to be strongly positive.
"""
import jax
import numpy as np
import pytest

from fineflax.envs.word_problems import generate_problems
from fineflax.jobs import rl as rl_job
from fineflax.jobs.resolve import load_config
from fineflax.rl.advantages import group_advantages
from fineflax.rl.batch import build_rl_batch, round_up
from fineflax.rl.collect import rollout_groups


def _upper_share(texts):
  return np.array([sum(ch.isupper() for ch in t) / max(len(t), 1) for t in texts], np.float32)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_updates_move_logp_along_the_advantages(tiny_smol, temperature):
  c = load_config("configs/grpo_arith.py:smoke")
  c.model.source = tiny_smol
  c.rl.temperature = temperature
  c.rl.max_new_tokens = 12
  c.rl.group_size = 8
  c.rl.agg_mode = "token-mean"
  c.rl.mask_truncated = False  # 12-token completions are mostly cut; they must enter the loss here
  c.optimizer.learning_rate = 2e-2
  c.optimizer.warmup_steps = 1
  c.rl.old_logp = "recompute"  # three steps on one batch with its recorded old_logp (not the one-step skip)
  job = rl_job.RLJob(c)
  tr = job.learner
  problems = generate_problems(2, "train", (1, 2), 0)
  rows, _ = rollout_groups(job.env, tr.policy(tr.state["params"]), problems, [None, None], jax.random.PRNGKey(0),
                           group_size=c.rl.group_size)
  rewards = _upper_share(rows["text"])
  batch = build_rl_batch(rows["prompt"], rows["completion"], rows["loss_mask"], pad_id=tr.pad_id,
                         completion_width=round_up(c.rl.max_new_tokens, 32))
  batch["advantages"] = np.asarray(group_advantages(rewards, c.rl.group_size), np.float32)
  batch["is_off_policy"] = np.zeros(len(rewards), bool)
  before = np.asarray(tr.logp_fn(tr.state["params"], tr.base, batch)[0])
  # the sampler's recorded log-probs are the (tempered) policy's log-probs of the same tokens
  for i, lp in enumerate(rows["rollout_logp"]):
    np.testing.assert_allclose(before[i, :len(lp)], lp, atol=2e-4)
  batch["old_logp"] = before
  for _ in range(3):  # the first update has learning rate 0 (warmup)
    tr.state, _ = tr.step_fn(tr.state, tr.base, batch)
  after = np.asarray(tr.logp_fn(tr.state["params"], tr.base, batch)[0])
  delta = ((after - before) * batch["mask"]).sum(1)
  assert np.corrcoef(batch["advantages"], delta)[0, 1] > 0.8
  assert np.mean(np.sign(delta) == np.sign(batch["advantages"])) >= 0.8
