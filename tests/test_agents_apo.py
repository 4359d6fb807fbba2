"""APO beam bookkeeping with a scripted agent, critic and editor: candidate counts, parents, beam selection
by score, critiques from failing rollouts only, the best prompt saved as a resource version."""
from __future__ import annotations

import dataclasses
import re

import pytest

from fineflax.agents import ScriptedLLM, Store, tool
from fineflax.agents.apo import APOSettings, apo, check_prompt, continue_chat, parse_prompt

pytestmark = pytest.mark.fast


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
  s = APOSettings(val_batch_size=6, gradient_batch_size=3, beam_width=2, branch_factor=2, beam_rounds=3, seed=1,
                  min_prompt_chars=5)
  tasks = list(range(12))
  res = apo(agent, "Solve it.", tasks, tasks[:9], None, critic, editor, store, s, num_workers=2, log=lambda m: None)
  cands = {c.id: c for c in res.candidates}
  assert len(cands) == 1 + 3 * 2 * 2 and len(editor.calls) == len(critic.calls) == 12
  assert res.history[0]["round"] == 0 and cands[0].scores["round 0 full val"] == 0.0  # the seed, scored first
  beam_before = [0]
  for h in res.history[1:]:
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
  leaders = [(h["leader_full_val"], h["leader"]) for h in res.history]  # round 0: the seed
  best_score = max(v for v, _ in leaders)
  assert res.best_score == best_score and res.best.id == next(i for v, i in leaders if v == best_score)
  assert res.best_score > 1 / 3  # the seed prompt solves no task; edits added rules
  saved = store.resource("prompt_template")
  assert saved["value"] == res.best.prompt and saved["version"] == res.version == 1
  assert len(saved["meta"]["candidates"]) == 13 and saved["meta"]["history"] == res.history
  assert [v["meta"]["parent"] for v in store.resource_versions("prompt_template:candidates")] == \
      [c.parent for c in res.candidates]
  assert not any(c.rejected for c in res.candidates) and all(h["rejected"] == [] for h in res.history)
  # the critic saw rendered traces of the failing rollouts (all of the batch only when none failed)
  some_failed = 0
  for req in critic.calls:
    text = req[0]["content"]
    rewards = [float(x) for x in re.findall(r"\(reward ([0-9.]+)\)", text)]
    assert rewards and (all(r < 1.0 for r in rewards) or rewards == [1.0] * s.gradient_batch_size)
    assert "[tool lookup]" in text
    some_failed += all(r < 1.0 for r in rewards)
  assert some_failed >= 6


def test_unusable_candidates_are_logged_and_skipped(tmp_path):
  """An editor reply that is empty, lacks a required string or repeats its parent, and an editor call that
  raises, each reject that child only (logged with the reason, stored, never scored); the search goes on.
  The old code scored any non-empty reply and crashed on a failing call."""
  store = Store(str(tmp_path / "s.sqlite"))
  replies = ["<prompt></prompt>", "<prompt>Solve it carefully, no hints here.</prompt>", "<prompt>Solve it.</prompt>",
             None, "<prompt>Solve it. rule1 and rule2 and rule0</prompt>", "I think the prompt <prompt>rule0 rule1"]

  def script(request, i):
    if replies[i] is None:
      raise ConnectionError("editor down")
    return replies[i]
  logs = []
  s = APOSettings(val_batch_size=6, gradient_batch_size=2, beam_width=1, branch_factor=3, beam_rounds=2,
                  required=("rule",), min_prompt_chars=5)
  res = apo(agent, "Solve it.", list(range(6)), list(range(6)), None, ScriptedLLM(lambda r, i: "c"),
            ScriptedLLM(script), store, s, num_workers=2, log=logs.append)
  reasons = [c.rejected for c in res.candidates]  # a round's expansions run concurrently: order within a round varies
  assert reasons[0] == "" and sorted(reasons[1:4]) == ["empty", "lacks ['rule']", "same as its parent"]
  assert sorted(reasons[4:], key=bool)[2].startswith("ConnectionError: editor down")
  assert sorted(reasons[4:])[:2] == ["", ""]
  bad2 = next(c.id for c in res.candidates[4:] if c.rejected)
  assert [h["rejected"] for h in res.history] == [[], [1, 2, 3], [bad2]] and res.history[1]["children"] == []
  assert all(not c.scores for c in res.candidates if c.rejected)  # never scored
  good = {c.prompt: c for c in res.candidates[4:] if not c.rejected}
  assert set(good) == {"rule0 rule1", "Solve it. rule1 and rule2 and rule0"}  # the unclosed reply's text is kept
  assert res.best is good["Solve it. rule1 and rule2 and rule0"] and res.best_score == 1.0
  assert sum("rejected" in m for m in logs) == 4
  stored = store.resource_versions("prompt_template:candidates")
  assert [v["meta"]["rejected"] for v in stored] == reasons


def test_time_budget_stops_the_search(tmp_path):
  store = Store(str(tmp_path / "s.sqlite"))
  critic = ScriptedLLM(lambda r, i: "c")
  s = APOSettings(val_batch_size=3, gradient_batch_size=1, beam_width=1, branch_factor=1, beam_rounds=5,
                  time_budget_s=1e-9)
  res = apo(agent, "Solve it. rule0", list(range(3)), list(range(3)), None, critic, critic, store, s,
            num_workers=1, log=lambda m: None)
  assert len(res.history) == 1 and not critic.calls and res.best.id == 0 and abs(res.best_score - 1 / 3) < 1e-9
  assert store.resource("prompt_template")["value"] == "Solve it. rule0"
  # a fake clock: round 0 ends at t=10, round 1 runs t=10..40 (30 s); with a 60 s budget round 2 would end at
  # ~70 s > 60 s, so it does not start (the old check, "budget already spent?", started it at 40 s)
  ticks = iter([0.0, 10.0, 10.0, 40.0, 40.0, 40.0] + [41.0] * 50)
  s2 = dataclasses.replace(s, time_budget_s=60.0)
  editor = ScriptedLLM(lambda r, i: "<prompt>Solve it. rule0 rule1</prompt>")
  logs = []
  res = apo(agent, "Solve it. rule0", list(range(3)), list(range(3)), None, critic, editor,
            Store(str(tmp_path / "t.sqlite")), s2, num_workers=1, log=logs.append, clock=lambda: next(ticks))
  assert [h["round"] for h in res.history] == [0, 1] and len(editor.calls) == 1
  assert "the last round took 30 s; stopping after 1 rounds" in logs[-1]


class _Tok:
  chat_template = "x"

  def __call__(self, text, **_):
    return {"input_ids": []}

  def apply_chat_template(self, messages, **_):
    return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_continue_chat_prefills_only_clients_that_can_continue():
  class Local(ScriptedLLM):
    def prompt_ids(self, messages):
      return []
  local = Local(lambda request, i: " new prompt</prompt>")
  local.tokenizer = _Tok()
  msgs = [{"role": "user", "content": "rewrite"}]
  assert continue_chat(local, msgs, "<prompt>") == "<prompt> new prompt</prompt>"
  assert local.calls[0].endswith("rewrite<assistant><prompt>")  # the completion prompt ends with the prefill
  remote = ScriptedLLM(lambda request, i: "<prompt>p</prompt>")
  assert continue_chat(remote, msgs, "<prompt>") == "<prompt>p</prompt>" and remote.calls == [msgs]


def test_parse_check_prompt_and_settings():
  assert parse_prompt("x <prompt> a </prompt> y <prompt>b</prompt>") == "b"
  assert parse_prompt("just text ") == "just text"
  assert parse_prompt("<prompt> cut at the budget") == "cut at the budget"  # unclosed (old code kept nothing)
  assert parse_prompt("<prompt>a <prompt>b</prompt>") == "b"
  s = APOSettings(required=("<calc>",))
  assert check_prompt("Use <calc>1+1</calc> then answer.", "old", s) == ""
  assert check_prompt("short", "old", s).startswith("shorter than 20")
  assert check_prompt("Use a calculator, then answer.", "old", s) == "lacks ['<calc>']"
  assert check_prompt("x" * 2001, "old", s).startswith("longer than 2000")
  assert check_prompt(" Use <calc>1+1</calc>\n then answer.", "Use <calc>1+1</calc> then answer.", s) == \
      "same as its parent"
  with pytest.raises(ValueError, match="beam_width=0"):
    APOSettings(beam_width=0)
  with pytest.raises(ValueError, match="time_budget_s=-1"):
    APOSettings(time_budget_s=-1)


def test_apo_presets_validate_and_bound_the_gpu_run():
  """gpu5 (benchmarks/run_gpu.sh apo) uses Agent Lightning's sizes and a search budget below the stage's 560 s
  hard stop; a validation batch larger than the validation set is a clear config error."""
  from configs.apo import get_config
  from fineflax.config_checks import ConfigError
  from fineflax.jobs.apo import validate
  for preset in ("", "cpu", "gpu5", "smoke"):
    validate(get_config(preset))
  g = get_config("gpu5")
  assert (g.task.num_val, g.apo.val_batch_size, g.apo.beam_width, g.apo.branch_factor, g.apo.beam_rounds) == \
      (29, 29, 2, 2, 2) and 0 < g.apo.time_budget_s <= 330
  g.apo.val_batch_size = 30
  with pytest.raises(ConfigError, match="val_batch_size"):
    validate(g)
