"""APO beam bookkeeping with a scripted agent, critic and editor: candidate counts, parents, beam selection
by score, critiques from failing rollouts only, the best prompt saved as a resource version."""
from __future__ import annotations

import re

import pytest

from fineflax.agents import ScriptedLLM, Store, tool
from fineflax.agents.apo import APOSettings, apo, parse_prompt


@tool(name="lookup")
def lookup(x):
  return x * 10


def agent(task, llm, resources):
  """Reward 1 iff the prompt holds the task's rule (rule0..rule2); one traced tool call."""
  lookup(task)
  return 1.0 if f"rule{task % 3}" in resources["prompt_template"] else 0.0


def editor_script(request, i):
  parent = re.search(r"## Prompt\n(.*?)\n\n## Critique", request[0]["content"], re.DOTALL).group(1)
  return f"Sure. <prompt>{parent} rule{i % 3}</prompt>"


def test_apo_beam_bookkeeping(tmp_path):
  store = Store(str(tmp_path / "s.sqlite"))
  critic = ScriptedLLM(lambda req, i: f"critique {i}")
  editor = ScriptedLLM(editor_script)
  s = APOSettings(val_batch_size=6, gradient_batch_size=3, beam_width=2, branch_factor=2, beam_rounds=3, seed=1)
  tasks = list(range(12))
  res = apo(agent, "Solve it.", tasks, tasks[:9], None, critic, editor, store, s, num_workers=2, log=lambda m: None)
  cands = {c.id: c for c in res.candidates}
  assert len(cands) == 1 + 3 * 2 * 2 and len(editor.calls) == len(critic.calls) == 12
  beam_before = [0]
  for h in res.history:
    rnd, key = h["round"], f"round {h['round']} val batch"
    children = [cands[i] for i in h["children"]]
    assert len(children) == s.beam_width * s.branch_factor and all(c.round == rnd for c in children)
    assert all(c.parent in beam_before for c in children)  # parents come from the previous beam
    assert all(c.prompt.startswith(cands[c.parent].prompt + " rule") for c in children)  # the editor's rewrite
    pool = [cands[i] for i in beam_before] + children
    expected = sorted(pool, key=lambda c: -c.scores[key])[:s.beam_width]
    assert h["beam"] == [c.id for c in expected] and h["beam_scores"] == [c.scores[key] for c in expected]
    assert h["leader_full_val"] == cands[h["leader"]].scores[f"round {rnd} full val"]
    beam_before = h["beam"]
  # the best prompt: the highest full-validation leader, saved as a new resource version with its history
  leaders = [(h["leader_full_val"], h["leader"]) for h in res.history]
  best_score = max(v for v, _ in leaders)
  assert res.best_score == best_score and res.best.id == next(i for v, i in leaders if v == best_score)
  assert res.best_score > 1 / 3  # the seed prompt solves no task; edits added rules
  saved = store.resource("prompt_template")
  assert saved["value"] == res.best.prompt and saved["version"] == res.version == 1
  assert len(saved["meta"]["candidates"]) == 13 and saved["meta"]["history"] == res.history
  assert [v["meta"]["parent"] for v in store.resource_versions("prompt_template:candidates")] == \
      [c.parent for c in res.candidates]
  # the critic saw rendered traces of the failing rollouts (all of the batch only when none failed)
  some_failed = 0
  for req in critic.calls:
    text = req[0]["content"]
    rewards = [float(x) for x in re.findall(r"\(reward ([0-9.]+)\)", text)]
    assert rewards and (all(r < 1.0 for r in rewards) or rewards == [1.0] * s.gradient_batch_size)
    assert "[tool lookup]" in text
    some_failed += all(r < 1.0 for r in rewards)
  assert some_failed >= 6


def test_parse_prompt_and_settings():
  assert parse_prompt("x <prompt> a </prompt> y <prompt>b</prompt>") == "b"
  assert parse_prompt("just text ") == "just text"
  with pytest.raises(ValueError, match="beam_width=0"):
    APOSettings(beam_width=0)
