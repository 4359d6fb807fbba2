"""The reward log survives SIGKILL of the server right after acknowledged feedback; a log holding rewards
the server no longer accepts (huge, infinite, NULL, text) still gives statistics and sane routing."""
import json
import logging
import os
import signal
import sqlite3
import urllib.request

import openai
import pytest

from fineflax.testing.serve import (free_port, server_argv, start_subprocess_server, thread_server, tiny_chat_model,
                             write_adapters)


def post(url, body):
  req = urllib.request.Request(url, data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(req, timeout=120) as r:
    return r.status, json.loads(r.read())


def test_sigkill_right_after_acknowledged_feedback_loses_nothing(tmp_path):
  model = tiny_chat_model(tmp_path)
  log = tmp_path / "log.sqlite"
  argv = server_argv(model, {}, log, free_port(), "--slots", "2", "--context", "64", "--chunk", "2",
                     "--quant", "none")
  proc, url = start_subprocess_server(argv)
  try:
    msgs = [{"role": "user", "content": "hello"}]
    status, resp = post(url + "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 3,
                                                       "temperature": 0})
    assert status == 200
    acked = []
    for i, reward in enumerate([1.0, 0.0, 0.25]):
      status, out = post(url + "/feedback", {"id": resp["id"], "reward": reward, "comment": f"c{i}"})
      assert status == 200
      acked.append((out["feedback_id"], reward, f"c{i}"))
    os.kill(proc.pid, signal.SIGKILL)  # no shutdown, no checkpoint, nothing flushed by the server
    proc.wait(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == -signal.SIGKILL
  db = sqlite3.connect(log)
  assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
  rows = db.execute("SELECT id, reward, comment FROM feedback WHERE response_id = ? ORDER BY id",
                    (resp["id"],)).fetchall()
  assert rows == acked
  rid, variant, answer, settings, messages = db.execute(
      "SELECT id, variant, answer, settings_json, messages_json FROM responses").fetchone()
  assert (rid, variant, answer) == (resp["id"], "tiny", resp["choices"][0]["message"]["content"])
  assert json.loads(settings)["max_tokens"] == 3 and json.loads(messages) == msgs


@pytest.mark.fast
def test_spawn_server_reports_a_server_that_exits(tmp_path):
  """A server that cannot start is an error that carries its own message (the log, or stderr's tail)."""
  from fineflax.serve.spawn import spawn_server
  missing = str(tmp_path / "no-such-model")
  with pytest.raises(RuntimeError, match="exited with") as err:
    spawn_server(["--model", missing, "--port", str(free_port())], timeout=120)
  assert "no-such-model" in str(err.value)
  log = tmp_path / "serve.log"
  with pytest.raises(RuntimeError, match=f"see {log}"):
    spawn_server(["--model", missing, "--port", str(free_port())], log_path=log, timeout=120)
  assert "no-such-model" in log.read_text()


def test_bad_rewards_already_in_the_log_are_skipped_or_clipped_at_start(tmp_path, caplog):
  """A log of an older server: alpha has one reward of 1e200 among nine 0s, beta ten 0.9s, tiny ten 0.5s,
  plus +-inf, NULL and text rewards. Before: /rl/stats answered 500 (inf in the JSON) for good and the
  router sent every model=auto request to alpha (mean 1e199). Now the non-numbers are skipped, 1e200 is
  clipped to the range's top (1), /rl/stats answers, routing follows the real means, and the log says
  so once."""
  from fineflax.serve.feedback import FeedbackLog
  model = tiny_chat_model(tmp_path)
  adapters = write_adapters(model, tmp_path)
  path = tmp_path / "old.sqlite"
  old = FeedbackLog(path)
  rewards = {"alpha": [1e200] + [0.0] * 9, "beta": [0.9] * 10, "tiny": [0.5] * 10}
  junk = [float("inf"), float("-inf"), None, "lots"]
  for variant, values in rewards.items():
    old.add_responses([{"id": f"{variant}-r", "variant": variant, "request": {}, "messages": [], "answer": "",
                        "settings": {}}])
    for r in values + junk:  # written as an older server (no range check) did
      old.db.execute("INSERT INTO feedback(response_id, reward, created) VALUES (?, ?, 0)", (f"{variant}-r", r))
  old.close()
  argv = server_argv(model, adapters, path, free_port(), "--slots", "1", "--context", "64", "--chunk", "2",
                     "--quant", "none")
  with caplog.at_level(logging.WARNING, logger="fineflax.serve"), thread_server(argv) as (url, server):
    for _ in range(2):
      with urllib.request.urlopen(url + "/rl/stats", timeout=60) as r:
        stats = json.loads(r.read())
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    answer = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=1)
  assert {v: s["feedback"] for v, s in stats["variants"].items()} == {"alpha": 10, "beta": 10, "tiny": 10}
  assert stats["variants"]["alpha"]["mean_reward"] == pytest.approx(0.1)
  assert stats["router"]["variants"]["beta"]["mean"] == pytest.approx(0.9)
  assert answer.model == "beta"  # UCB1: equal counts, so the best mean
  warnings = [r.getMessage() for r in caplog.records if r.name == "fineflax.serve"]
  assert len(warnings) == 1 and "12 feedback rewards that are not finite numbers skipped" in warnings[0]
  assert "1 outside [-1, 1] clipped" in warnings[0]
