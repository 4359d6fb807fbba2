"""The reward log survives SIGKILL of the server right after acknowledged feedback."""
import json
import os
import signal
import sqlite3
import urllib.request

import pytest

from _serve_fixtures import free_port, server_argv, start_subprocess_server, tiny_chat_model


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
