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
