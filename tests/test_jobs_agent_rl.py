"""The agent_rl job: config errors name the field; a run with a two-call agent trains from its traces (every
call a transition, per-task groups, a non-zero update) and leaves its rollouts and spans in the store."""
from __future__ import annotations

import os

import numpy as np
import pytest

from fineflax.agents import Store
from fineflax.config_checks import ConfigError
from fineflax.jobs import agent_rl
from fineflax.jobs.resolve import load_config


def _config(source="smollm2-135m-instruct", preset="smoke", **over):
  return load_config(f"configs/agent_rl.py:{preset}", [f"model.source={source}", *[f"{k}={v}" for k, v in over.items()]])


@pytest.mark.fast
@pytest.mark.parametrize("over, message", [
    ({"rl.objective": "luffy"}, "config.rl.objective='luffy' adds off-policy rows"),
    ({"agent.credit": "bogus"}, "config.agent.credit='bogus': choose one of 'final', 'discounted'"),
    ({"rl.dynamic_sampling": True}, "config.rl.dynamic_sampling=True: must be off"),
    ({"rl.async_steps": 1}, "config.rl.async_steps=1: must be off (agent rollouts run synchronously)"),
    ({"rl.importance": "tis"}, "config.rl.importance='tis': must be none"),
    ({"agent.gamma": 1.5}, "config.agent.gamma=1.5"),
])
def test_config_errors_name_the_field(over, message):
  c = _config(**over)
  if over.get("rl.objective") == "luffy":
    from configs.common import luffy_section
    with c.unlocked():
      luffy_section(c.rl)
  with pytest.raises(ConfigError) as e:
    agent_rl.validate(c)
  assert message in str(e.value)


@pytest.mark.fast
def test_search_r1_preset_builds_its_tasks_and_checks_its_sections():
  c = _config(preset="search_r1,smoke", **{"kb.num_people": 12, "kb.num_cities": 6, "kb.num_countries": 3,
                                           "task.num_eval": 4})
  agent_rl.validate(c)
  assert c.agent.merge and c.agent.name == "search_r1"
  train, held = agent_rl.make_tasks(c)
  assert len(held) == 4 and not {t["question"] for t in train} & {t["question"] for t in held}
  c = _config(**{"agent.name": "search_r1"})
  with pytest.raises(ConfigError, match="config.kb is missing: agent.name='search_r1' needs it"):
    agent_rl.validate(c)


def two_calls(task, llm, resources):
  """Two calls; reward 1 iff the first reply's first token id is even (varies within a group)."""
  first = llm.chat([{"role": "system", "content": resources["prompt_template"]},
                    {"role": "user", "content": task["question"]}])
  llm.chat([{"role": "user", "content": "Check: " + first.text}])
  return float(first.response_ids[0] % 2 == 0)


@pytest.mark.long
def test_agent_rl_job_trains_from_traces(tiny_smol, tmp_path, monkeypatch):
  from fineflax.agents.calculator import CalculatorAgent
  monkeypatch.setattr(agent_rl, "make_agent",
                      lambda config, tok=None, greedy=False: CalculatorAgent(1, temperature=0.0) if greedy else two_calls)
  c = _config(tiny_smol, **{"rl.group_size": 4, "num_steps": 1, "eval_every": 1, "eval_at_start": False,
                             "task.num_eval": 2, "agent.max_calls": 1,
                             "lora.targets": "('q','v')"})  # 4 adapter tensors per layer, not 14: faster compile
  out = agent_rl.run(c, str(tmp_path))
  (h,) = out["history"]
  assert h["step"] == 1 and 0 <= h["eval_accuracy"] <= 1 and h["eval_calls"] == 1.0
  assert h["transitions"] == 2 * 4 * 2 and h["calls_per_rollout"] == 2.0
  assert h["grad_norm"] > 0 and h["zero_advantage_share"] < 1
  store = Store(os.path.join(tmp_path, "agent_store.sqlite"))
  train = store.rollouts(mode="train")
  assert len(train) == 2 * 4 and all(r["status"] == "succeeded" for r in train)
  assert len({r["group_id"] for r in train}) == 2  # 2 tasks, 4 rollouts each
  assert len(store.rollouts(mode="eval")) == 2
  spans = store.spans(kind="llm")
  assert all(s.attributes["response_ids"] and len(s.attributes["logprobs"]) == len(s.attributes["response_ids"])
             for s in spans)
  assert store.resource("prompt_template")["value"] == c.agent.prompt_template
  assert os.path.exists(os.path.join(tmp_path, "adapter")) and out["summary"]["store"].endswith("agent_store.sqlite")


def _merged_rollout(rollout: str, group: str, reward: float, seed: int):
  """One merged row of a two-call rollout: response 1, inserted tool text (loss mask 0), response 2."""
  from fineflax.agents.transitions import Transition, merge_transitions
  rng = np.random.RandomState(seed)
  prompt, r1, tool, r2 = (list(rng.randint(2, 90, n)) for n in (5, 4, 3, 4))
  calls = [Transition(rollout, group, 0, prompt, r1, [-1.0] * 4, reward, reward),
           Transition(rollout, group, 1, prompt + r1 + tool, r2, [-1.0] * 4, reward, reward)]
  return merge_transitions(calls)


@pytest.mark.fast
def test_ppo_batch_of_merged_agent_rows_gives_tool_tokens_no_policy_gradient():
  """PPO on agent rows: GAE runs over every completion token (tool text too, as Search-R1), but the policy
  loss's gradient is 0 at the tool tokens and at the rows padded to ROW_BUCKET, which are also out of GAE."""
  import types

  import jax
  import jax.numpy as jnp

  from fineflax.rl.objectives import get_objective
  from fineflax.rl.ppo import ppo_targets
  c = _config(preset="ppo,smoke")
  rl = agent_rl.validate(c)  # PPO is accepted for agent transitions
  ts = [_merged_rollout(f"r{i}", f"g{i // 2}", float(i % 2), i) for i in range(4)]
  fake = types.SimpleNamespace(learner=types.SimpleNamespace(critic=object(), pad_id=0), rl=rl)
  batch = agent_rl.AgentRLJob.update_batch(fake, ts, np.ones(4, np.float32))
  b, n = batch["mask"].shape
  assert b == agent_rl.ROW_BUCKET and np.all(batch["advantages"] == 0)
  np.testing.assert_array_equal(batch["rewards"][:4], [0.0, 1.0, 0.0, 1.0])
  rm, mask = batch["response_mask"], batch["mask"]
  assert rm[4:].sum() == 0 and mask[4:].sum() == 0  # padded rows: out of GAE and of the loss
  tool = (rm > 0) & (mask == 0)
  assert tool[:4].sum(1).tolist() == [3] * 4  # each real row holds its 3 inserted tool tokens
  rng = np.random.RandomState(0)
  batch.update(values=rng.randn(b, n).astype(np.float32), old_logp=-rng.rand(b, n).astype(np.float32),
               ref_logp=-rng.rand(b, n).astype(np.float32))
  adv, _, _ = ppo_targets(batch, rl.ppo)
  assert np.abs(adv[tool]).min() > 0  # GAE gives the tool tokens advantages ...
  obj = get_objective("ppo")
  pb = {k: jnp.asarray(v) for k, v in dict(batch, advantages=adv).items()}
  grad = jax.grad(lambda lp: obj.loss(lp, jnp.zeros_like(lp), pb, **obj.kwargs(rl))[0])(pb["old_logp"])
  grad = np.asarray(grad)
  assert np.all(grad[tool] == 0) and np.all(grad[4:] == 0)  # ... which get no policy gradient
  assert np.all(grad[mask > 0] != 0)


@pytest.mark.long
def test_ppo_agent_rl_job_runs_and_its_critic_fits_a_fixed_batch(tiny_smol, tmp_path, monkeypatch):
  """rl.objective=ppo through agent_rl.run (a LoRA critic), then more updates on the step's batch: the value
  loss falls."""
  monkeypatch.setattr(agent_rl, "make_agent", lambda config, tok=None, greedy=False: two_calls)
  batches = []
  real = agent_rl.Learner.update

  def keep_batch(self, state, batch):
    batches.append(dict(batch))
    return real(self, state, batch)

  monkeypatch.setattr(agent_rl.Learner, "update", keep_batch)
  c = _config(tiny_smol, preset="ppo,smoke", **{"rl.group_size": 4, "num_steps": 1, "eval_every": 1,
                                                 "eval_at_start": False, "task.num_eval": 2, "agent.max_calls": 1,
                                                 "lora.targets": "('q','v')", "rl.ppo.critic_lr": 1e-2})
  out = agent_rl.run(c, str(tmp_path))
  (h,) = out["history"]
  assert out["exit_code"] == 0 and h["transitions"] == 2 * 4 * 2
  assert np.isfinite(h["vf_loss"]) and h["critic_grad_norm"] > 0 and np.isfinite(h["loss"])
  learner, state = out["job"].learner, out["job"].learner.state
  losses = []
  for _ in range(4):
    state, m = learner.update(state, batches[0])
    losses.append(m["vf_loss"])
  assert losses[-1] < losses[0], losses
