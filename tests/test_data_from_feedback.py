"""from_feedback on a reward log built here: filter by mean reward, dedup, hash split, preference pairs,
the SFT loader reads the output, clear errors for a missing / invalid log."""
import json
import sqlite3
import subprocess
import sys

import pytest

from fineflax.data import load_source
from fineflax.data.from_feedback import FeedbackLogError, convert, in_holdout, prompt_key, read_log

SCHEMA = """
CREATE TABLE responses(id TEXT PRIMARY KEY, created REAL, variant TEXT, request_json TEXT,
                       messages_json TEXT, answer TEXT, settings_json TEXT);
CREATE TABLE feedback(id INTEGER PRIMARY KEY, response_id TEXT, reward REAL, comment TEXT, created REAL);
"""


def q(text):
  return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


def make_log(path, responses, feedback):
  """responses: (id, messages, answer, variant); feedback: (response_id, reward)."""
  con = sqlite3.connect(path)
  con.executescript(SCHEMA)
  for t, (rid, msgs, answer, variant) in enumerate(responses):
    con.execute("INSERT INTO responses VALUES (?,?,?,?,?,?,?)",
                (rid, float(t), variant, json.dumps({"messages": msgs}), json.dumps(msgs), answer, "{}"))
  for rid, reward in feedback:
    con.execute("INSERT INTO feedback(response_id, reward, comment, created) VALUES (?,?,?,?)",
                (rid, reward, None, 0.0))
  con.commit()
  con.close()
  return path


RESPONSES = [
    ("r1", q("2+2?"), "4", "a"), ("r2", q("2+2?"), "5", "b"), ("r3", q("2+2?"), "4", "b"),  # r3 = dup of r1
    ("r4", q("3*3?"), "9", "a"), ("r5", q("3*3?"), "6", "b"),
    ("r6", q("1+1?"), "2", "a"),                                                          # no feedback
    ("r7", q("7-2?"), "5", "a"),
]
FEEDBACK = [("r1", 1.0), ("r1", 0.0), ("r2", 0.0), ("r3", 1.0), ("r4", 1.0), ("r5", 0.0), ("r7", 1.0),
            ("r7", 1.0)]


@pytest.fixture
def log(tmp_path):
  return make_log(tmp_path / "fb.db", RESPONSES, FEEDBACK)


def test_mean_reward_filter_dedup_and_loader(log, tmp_path):
  records = {r["id"]: r for r in read_log(log)}
  assert set(records) == {"r1", "r2", "r3", "r4", "r5", "r7"}  # r6 has no feedback
  assert records["r1"]["reward"] == 0.5 and records["r1"]["num_feedback"] == 2  # mean of 1 and 0
  out = tmp_path / "sft.jsonl"
  counts = convert(log, out, min_reward=0.5)
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  # "2+2?" -> "4" appears twice (r1 mean 0.5, r3 1.0): one row, the higher-rewarded copy
  assert [r["id"] for r in rows] == ["r3", "r4", "r7"] and counts["train"] == 3
  assert rows[0]["messages"][-1] == {"role": "assistant", "content": "4"}
  assert rows[0]["messages"][:-1] == q("2+2?")
  src = load_source(str(out))
  assert src.schema == "messages" and len(src) == 3
  assert src[1]["messages"][-1]["content"] == "9"


@pytest.mark.fast
def test_holdout_split_is_by_prompt_and_deterministic(tmp_path):
  responses = [(f"r{i}", q(f"{i}+1?"), str(i + 1), "a") for i in range(200)]
  responses += [(f"s{i}", q(f"{i}+1?"), f"{i + 1}.", "b") for i in range(200)]  # a 2nd answer per prompt
  log = make_log(tmp_path / "fb.db", responses, [(r[0], 1.0) for r in responses])
  outs = []
  for k in range(2):
    train, held = tmp_path / f"t{k}.jsonl", tmp_path / f"h{k}.jsonl"
    convert(log, train, min_reward=1.0, holdout=0.2, holdout_out=held)
    outs.append((train.read_text(), held.read_text()))
  assert outs[0] == outs[1]
  train = [json.loads(x) for x in outs[0][0].splitlines()]
  held = [json.loads(x) for x in outs[0][1].splitlines()]
  key = lambda r: prompt_key(r["messages"][:-1])
  assert not {key(r) for r in train} & {key(r) for r in held}
  assert len(train) + len(held) == 400 and 40 < len(held) < 120  # ~20 % of 400
  assert all(in_holdout(key(r), 0.2) for r in held)


def test_preference_pairs(log, tmp_path):
  pairs_out = tmp_path / "pairs.jsonl"
  counts = convert(log, tmp_path / "sft.jsonl", min_reward=1.0, pairs_out=pairs_out)
  pairs = [json.loads(x) for x in pairs_out.read_text().splitlines()]
  assert counts["pairs"] == 2
  by_q = {p["prompt"][-1]["content"]: p for p in pairs}
  assert by_q["2+2?"]["chosen"] == [{"role": "assistant", "content": "4"}]
  assert by_q["2+2?"]["rejected"] == [{"role": "assistant", "content": "5"}]
  assert (by_q["2+2?"]["chosen_reward"], by_q["2+2?"]["rejected_reward"]) == (1.0, 0.0)
  assert by_q["3*3?"]["rejected"][0]["content"] == "6"
  convert(log, tmp_path / "sft.jsonl", min_reward=1.0, pairs_out=pairs_out, min_margin=1.0)
  assert pairs_out.read_text() == ""  # gaps of 1.0 are not > 1.0


@pytest.mark.fast
def test_errors_name_the_file_and_row(tmp_path, log):
  with pytest.raises(FeedbackLogError, match="no such reward log"):
    read_log(tmp_path / "missing.db")
  junk = tmp_path / "junk.db"
  junk.write_text("not a database at all" * 100)
  with pytest.raises(FeedbackLogError, match="junk.db: not a readable SQLite database"):
    read_log(junk)
  empty = tmp_path / "empty.db"
  sqlite3.connect(empty).execute("CREATE TABLE responses(id TEXT)").connection.close()
  with pytest.raises(FeedbackLogError, match=r"table 'responses' lacks columns \['created'"):
    read_log(empty)
  con = sqlite3.connect(tmp_path / "nofb.db")
  con.execute("CREATE TABLE responses(id TEXT, created REAL, variant TEXT, messages_json TEXT, answer TEXT)")
  con.close()
  with pytest.raises(FeedbackLogError, match="table 'feedback' is missing"):
    read_log(tmp_path / "nofb.db")
  bad = make_log(tmp_path / "bad.db", [("x1", q("a"), "b", "a")], [("x1", 1.0)])
  con = sqlite3.connect(bad)
  con.execute("UPDATE responses SET messages_json = '[{\"role\": \"robot\", \"content\": \"hi\"}]'")
  con.commit()
  con.close()
  with pytest.raises(FeedbackLogError, match=r"response 'x1': messages\[0\].role: 'robot'"):
    read_log(bad)
  assert read_log(bad, on_bad_row="skip") == []


def test_cli(log, tmp_path):
  out = tmp_path / "o.jsonl"
  r = subprocess.run([sys.executable, "-m", "fineflax.data.from_feedback", "--log", str(log),
                      "--min-reward", "1", "--out", str(out), "--pairs-out", str(tmp_path / "p.jsonl")],
                     capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
  assert json.loads(r.stdout) == {"rated": 6, "train": 3, "holdout": 0, "pairs": 2}
  r = subprocess.run([sys.executable, "-m", "fineflax.data.from_feedback", "--log", str(tmp_path / "nope.db"),
                      "--min-reward", "1", "--out", str(out)], capture_output=True, text=True)
  assert r.returncode == 2 and "nope.db: no such reward log" in r.stderr
