"""Agents without a model: scripted agents through the runner, store, transitions and credit assignment."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fineflax.agents import (ScriptedLLM, Store, credit, emit_reward, group_advantages, merge_transitions,
                             rollout_transitions, run_rollouts, tool, transition_batch)
from fineflax.agents.calculator import CalcError, calculator, parse_call, safe_eval


class CharTok:
  """A tokenizer whose ids are character codes (enough for ScriptedLLM.complete)."""

  def __call__(self, text, add_special_tokens=False):
    return {"input_ids": [ord(c) for c in text]}

  def decode(self, ids, skip_special_tokens=True):
    return "".join(map(chr, ids))


@tool(name="double")
def double(x):
  return 2 * x


def scripted_agent(task, llm, resources):
  """Three calls, each continuing the context; an intermediate reward after call 1; final = task's."""
  ctx = [ord(c) for c in task["question"]]
  for i in range(3):
    c = llm.complete(ctx, stop=["|"])
    ctx = ctx + c.response_ids + [ord(c) for c in f"<{double(i)}>"]
    if i == 1:
      emit_reward(0.5)
  return task["reward"]


def test_runner_store_and_credit(tmp_path):
  store = Store(str(tmp_path / "s.sqlite"))
  llm = ScriptedLLM(lambda req, i: "ab|cd", tokenizer=CharTok())
  tasks = [{"question": "q1", "reward": r} for r in (1.0, 0.0)] + [{"question": "q2", "reward": r} for r in (1.0, 1.0)]
  recs = run_rollouts(scripted_agent, tasks, llm, {}, store, num_workers=3, group_ids=["a", "a", "b", "b"])
  assert [r.reward for r in recs] == [1.0, 0.0, 1.0, 1.0] and all(r.status == "succeeded" for r in recs)
  kinds = [s.kind for s in recs[0].spans]
  assert kinds == ["llm", "tool", "llm", "tool", "reward", "llm", "tool", "reward"]
  llm_span = recs[0].spans[0].attributes
  assert llm_span["response_ids"] == [ord("a"), ord("b"), ord("|")] and llm_span["text"] == "ab|"
  assert llm_span["prompt_ids"] == [ord("q"), ord("1")]
  # the store holds the same spans, in order, and answers queries
  stored = store.spans(rollout_id=recs[0].rollout_id)
  assert [(s.seq, s.kind, s.attributes) for s in stored] == [(s.seq, s.kind, s.attributes) for s in recs[0].spans]
  counts = {r["kind"]: r["n"] for r in store.query("SELECT kind, COUNT(*) n FROM spans GROUP BY kind")}
  assert counts == {"llm": 12, "tool": 12, "reward": 8}
  assert len(store.rollouts(status="succeeded")) == 4 and len(store.rollouts(group_id="a")) == 2
  n = store.export_jsonl(str(tmp_path / "out.jsonl"))
  lines = [json.loads(x) for x in open(tmp_path / "out.jsonl")]
  assert n == 4 and sum(len(x["spans"]) for x in lines) == 32 and lines[0]["attempts"][0]["status"] == "succeeded"
  # credit: final -> R for each call; discounted -> gamma^(k-i) sums with the intermediate 0.5 after call 1
  t_final = rollout_transitions(recs[0], "final")
  assert [t.reward for t in t_final] == [1.0, 1.0, 1.0]
  t_disc = rollout_transitions(recs[0], "discounted", gamma=0.5)
  np.testing.assert_allclose([t.reward for t in t_disc], [0.5 * 0.5 + 0.25 * 1.0, 0.5 + 0.5 * 1.0, 1.0])
  assert credit(3, 2.0, scheme="discounted", gamma=0.9) == pytest.approx([2 * 0.81, 2 * 0.9, 2.0])
  # group advantages over all transitions of a task's rollouts
  ts = [t for r in recs for t in rollout_transitions(r, "final")]
  adv = group_advantages([t.reward for t in ts], [t.group_id for t in ts])
  r_a = np.array([1.0] * 3 + [0.0] * 3)
  np.testing.assert_allclose(adv[:6], (r_a - r_a.mean()) / (r_a.std(ddof=1) + 1e-6), rtol=1e-5)
  assert np.all(adv[6:] == 0)  # task b: all rewards equal
  # merging continued calls gives one row with the inserted text masked out
  m = merge_transitions(t_final)
  assert m.prompt_ids == [ord("q"), ord("1")]
  assert CharTok().decode(m.response_ids) == "ab|<0>ab|<2>ab|"
  assert m.loss_mask == [1.0] * 3 + [0.0] * 3 + [1.0] * 3 + [0.0] * 3 + [1.0] * 3
  batch = transition_batch(ts, adv, pad_id=0)
  assert batch["completion"].shape[0] == 12 and batch["mask"].sum() == 36 and batch["advantages"].shape == (12,)


def test_retries_and_failed_rollouts():
  store = Store()
  calls = []

  def flaky(task, llm, resources):
    calls.append(1)
    if len(calls) < 2:
      raise RuntimeError("tool down")
    return 1.0

  (rec,) = run_rollouts(flaky, [{"q": 1}], None, {}, store, max_attempts=3)
  assert rec.status == "succeeded" and rec.attempts == 2
  att = store.attempts(rec.rollout_id)
  assert [a["status"] for a in att] == ["failed", "succeeded"] and "tool down" in att[0]["error"]
  (bad,) = run_rollouts(lambda t, l, r: 1 / 0, [{}], None, {}, store, max_attempts=2)
  assert bad.status == "failed" and bad.reward is None and "ZeroDivisionError" in bad.error
  assert rollout_transitions(bad) == []


def test_resources_are_versioned():
  store = Store()
  assert store.add_resource("prompt_template", "v1 text") == 1
  assert store.add_resource("prompt_template", "v2 text", {"score": 0.5}) == 2
  assert store.resource("prompt_template")["value"] == "v2 text"
  assert store.resource("prompt_template", 1)["value"] == "v1 text"
  with pytest.raises(KeyError, match="'nope'"):
    store.resource("nope")


def test_safe_eval_whitelist():
  assert safe_eval("12 + 5 * (3 - 1)") == 22 and safe_eval("7 / 2") == 3.5 and safe_eval("-3 ^ 2") == -9
  for bad in ('__import__("os").system("x")', "a + 1", "2 ** 100", "1 / 0", "[1]", "(1).real", "9" * 300):
    with pytest.raises(CalcError):
      safe_eval(bad)
  assert calculator("1/0") == "error: division by zero"
  assert parse_call("so <calc>3*4</calc>") == "3*4" and parse_call("no call") is None


DURABLE_CHILD = textwrap.dedent("""
  import sys, time
  from fineflax.agents import Store, run_rollouts, tool
  store = Store(sys.argv[1])
  @tool(name="step")
  def step(i):
    return i
  def agent(task, llm, resources):
    for i in range(1000):
      step(i)
      print(i, flush=True)  # span i is committed: add_span returned
      time.sleep(0.01)
  run_rollouts(agent, [{"q": 0}], None, {}, store)
""")


def test_sigkill_mid_rollout_loses_no_finished_span(tmp_path):
  path = str(tmp_path / "s.sqlite")
  proc = subprocess.Popen([sys.executable, "-c", DURABLE_CHILD, path], stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
  done = -1
  for line in proc.stdout:
    done = int(line)
    if done >= 20:
      break
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  store = Store(path)
  spans = store.spans(kind="tool")
  assert len(spans) >= done + 1 and [s.attributes["result"] for s in spans] == list(range(len(spans)))
  (r,) = store.rollouts()
  assert r["status"] == "running"  # killed mid-rollout: visible as unfinished
