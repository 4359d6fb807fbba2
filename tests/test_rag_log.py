"""Logs that train: RAG records survive SIGKILL whole or not at all (every acknowledged one survives), and
from_feedback builds SFT rows with the context the agent saw (or without, for the ablation) and preference
pairs across variants that answered the same question."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from fineflax.data.from_feedback import convert, read_log
from fineflax.serve.feedback import FeedbackLog

pytestmark = pytest.mark.fast

WRITER = textwrap.dedent("""
    import sys
    from fineflax.serve.feedback import FeedbackLog
    log = FeedbackLog(sys.argv[1])
    i = 0
    while True:
      n = 1 + i % 5
      passages = [{"id": f"d{i}-{j}", "title": f"t{j}", "text": ("passage %d " % j) * 4000} for j in range(n)]
      log.add_responses([{"id": f"r{i}-n{n}", "variant": "naive_rag", "request": {}, "answer": f"answer {i}",
                          "messages": [{"role": "user", "content": f"q{i}"}], "settings": {}, "question": f"q{i}",
                          "category": "keyword", "passages": passages,
                          "input": [{"role": "system", "content": "ctx"}, {"role": "user", "content": f"q{i}"}]}])
      print(f"r{i}-n{n}", flush=True)  # acknowledged: add_responses returned
      i += 1
""")


@pytest.mark.parametrize("acked_before_kill", [3, 17])
def test_a_record_killed_mid_write_is_whole_or_absent_and_acknowledged_ones_survive(tmp_path, acked_before_kill):
  path = tmp_path / "log.sqlite"
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True,
                          cwd=root, env=dict(os.environ, PYTHONPATH=root))
  acked = []
  try:
    while len(acked) < acked_before_kill:
      line = proc.stdout.readline()
      assert line, "the writer died"
      acked.append(line.strip())
    os.kill(proc.pid, signal.SIGKILL)  # the next record (~100-600 kB) is being written now
    proc.wait(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
  acked += [line.strip() for line in proc.stdout.read().splitlines()]  # printed before the kill landed
  assert proc.returncode == -signal.SIGKILL
  db = sqlite3.connect(path)
  rows = db.execute("SELECT id, question, category, passages_json, input_json, answer FROM responses").fetchall()
  ids = [r[0] for r in rows]
  assert set(acked) <= set(ids) and len(ids) <= len(acked) + 1
  for rid, question, category, passages, inputs, answer in rows:
    i, n = (int(x) for x in rid[1:].split("-n"))
    got = json.loads(passages)
    assert [p["id"] for p in got] == [f"d{i}-{j}" for j in range(n)]
    assert all(p["text"] == ("passage %d " % j) * 4000 for j, p in enumerate(got))
    assert (question, category, answer) == (f"q{i}", "keyword", f"answer {i}") and json.loads(inputs)[1]["content"] == question


def _rag_log(path):
  log = FeedbackLog(path)
  q = [{"role": "user", "content": "Where was Ada born?"}]
  ctx = lambda doc: [{"role": "system", "content": f"Doc 1(Title: Ada) {doc}"}] + q
  rows = [("a1", "bm25_rag", "Kaford", "Ada was born in Kaford.", 1.0),
          ("a2", "dense_rag", "Zenport", "Ada likes Zenport.", 0.0),
          ("a3", "no_rag", "Paris", None, 0.5)]
  for rid, variant, answer, doc, reward in rows:
    log.add_responses([{"id": rid, "variant": variant, "request": {}, "messages": q, "answer": answer,
                        "settings": {}, "question": q[0]["content"], "category": "keyword",
                        "passages": [{"id": "d1", "title": "Ada", "text": doc}] if doc else [],
                        "input": ctx(doc) if doc else q}])
    log.add_feedback(rid, reward)
  log.close()
  return q, ctx


def test_sft_rows_carry_the_context_the_agent_saw_and_pairs_join_variants(tmp_path):
  q, ctx = _rag_log(tmp_path / "log.sqlite")
  out, pairs = tmp_path / "sft.jsonl", tmp_path / "pairs.jsonl"
  counts = convert(tmp_path / "log.sqlite", out, min_reward=0.5, pairs_out=pairs)
  assert counts == {"rated": 3, "train": 2, "holdout": 0, "pairs": 1}
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert rows[0]["messages"] == ctx("Ada was born in Kaford.") + [{"role": "assistant", "content": "Kaford"}]
  assert rows[0]["passages"] == [{"id": "d1", "title": "Ada", "text": "Ada was born in Kaford."}]
  assert rows[0]["category"] == "keyword" and rows[1]["messages"] == q + [{"role": "assistant", "content": "Paris"}]
  (pair,) = [json.loads(line) for line in pairs.read_text().splitlines()]
  assert pair["prompt"] == q and (pair["chosen_variant"], pair["rejected_variant"]) == ("bm25_rag", "dense_rag")
  assert pair["chosen"][0]["content"] == "Kaford" and pair["rejected"][0]["content"] == "Zenport"
  convert(tmp_path / "log.sqlite", out, min_reward=0.5, context=False)
  assert [json.loads(line)["messages"][:-1] for line in out.read_text().splitlines()] == [q, q]


def test_a_log_without_rag_columns_still_reads(tmp_path):
  path = tmp_path / "old.sqlite"
  db = sqlite3.connect(path)
  db.executescript("CREATE TABLE responses(id TEXT PRIMARY KEY, created REAL, variant TEXT, request_json TEXT, "
                   "messages_json TEXT, answer TEXT, settings_json TEXT); CREATE TABLE feedback(id INTEGER "
                   "PRIMARY KEY, response_id TEXT, reward REAL, comment TEXT, created REAL);")
  db.execute("INSERT INTO responses VALUES ('r', 1, 'base', '{}', ?, 'hi', '{}')",
             (json.dumps([{"role": "user", "content": "hello"}]),))
  db.execute("INSERT INTO feedback VALUES (1, 'r', 1.0, NULL, 2)")
  db.commit()
  db.close()
  (rec,) = read_log(path)
  assert rec["input"] is None and rec["category"] is None
  log = FeedbackLog(path)  # the server opens it: the RAG columns are added, the row is kept
  assert log.stats()["base"]["feedback"] == 1 and log.category_stats() == {}
