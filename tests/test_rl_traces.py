"""Off-policy trace loading (LUFFY and plain formats; JSON, JSONL, Parquet) and its error messages."""
from __future__ import annotations

import json

import pytest

from fineflax.rl.traces import Trace, TraceFormatError, filter_traces, load_traces

pytestmark = pytest.mark.fast

LUFFY = {"data_source": "openr1", "prompt": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "What is 2+3?"}],
         "target": [{"role": "assistant", "content": "<think>2+3=5</think>The answer is 5."}],
         "ability": "math", "reward_model": {"style": "rule", "ground_truth": "5"}}
PLAIN = {"question": "What is 4*4?", "reasoning": "<think>16</think>16", "answer": 16,
         "behaviour_logp": [-0.1, -0.2]}


def _jsonl(path, records):
  path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
  return path


def test_luffy_and_plain_jsonl(tmp_path):
  path = _jsonl(tmp_path / "t.jsonl", [LUFFY, "", PLAIN])
  a, b = load_traces(path)
  assert a == Trace("What is 2+3?", LUFFY["prompt"], LUFFY["target"][0]["content"], "5", None, str(path), 0)
  assert (b.question, b.response, b.answer, b.behaviour_logp, b.index) == (
      "What is 4*4?", "<think>16</think>16", "16", [-0.1, -0.2], 1)
  assert b.messages == [{"role": "user", "content": "What is 4*4?"}]


def test_json_and_parquet(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  (tmp_path / "t.json").write_text(json.dumps({"data": [LUFFY, LUFFY]}))
  assert [t.answer for t in load_traces(tmp_path / "t.json")] == ["5", "5"]
  pq.write_table(pa.Table.from_pylist([LUFFY]), tmp_path / "t.parquet")
  (t,) = load_traces(tmp_path / "t.parquet")
  assert (t.question, t.response, t.messages) == ("What is 2+3?", LUFFY["target"][0]["content"], LUFFY["prompt"])


@pytest.mark.parametrize("bad,where,what", [
    ({k: v for k, v in LUFFY.items() if k != "target"}, "line 2", "missing field 'target'"),
    (dict(LUFFY, reward_model={"style": "rule"}), "line 2", "missing field 'reward_model.ground_truth'"),
    (dict(LUFFY, prompt=[{"role": "user"}]), "line 2", "field 'prompt'[0] must be a message"),
    (dict(LUFFY, prompt=[{"role": "system", "content": "x"}]), "line 2", "no user message"),
    ({"question": "q", "answer": "1"}, "line 2", "missing field 'response' (or 'reasoning')"),
    ({"question": "q", "response": "r"}, "line 2", "missing field 'answer'"),
    (dict(PLAIN, behaviour_logp=["x"]), "line 2", "'behaviour_logp' must be a list of numbers"),
    ({"text": "hello"}, "line 2", "unknown record format"),
    ('{"prompt": [', "line 2", "invalid JSON"),
])
def test_malformed_jsonl_names_file_line_and_field(tmp_path, bad, where, what):
  path = _jsonl(tmp_path / "bad.jsonl", [LUFFY, bad])
  with pytest.raises(TraceFormatError) as e:
    load_traces(path)
  assert str(e.value).startswith(f"{path}: {where}:") and what in str(e.value)


def test_malformed_json_and_parquet_name_the_record(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  (tmp_path / "bad.json").write_text(json.dumps([PLAIN, PLAIN, {"question": "q", "response": "r"}]))
  with pytest.raises(TraceFormatError, match=r"bad\.json: record 2: missing field 'answer'"):
    load_traces(tmp_path / "bad.json")
  pq.write_table(pa.Table.from_pylist([{"question": "q", "response": "r", "answer": None}]),
                 tmp_path / "bad.parquet")
  with pytest.raises(TraceFormatError, match=r"bad\.parquet: row 0: missing field 'answer'"):
    load_traces(tmp_path / "bad.parquet")
  (tmp_path / "x.txt").write_text("hi")
  with pytest.raises(TraceFormatError, match="unsupported trace file type '.txt'"):
    load_traces(tmp_path / "x.txt")
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    load_traces(tmp_path / "nope.jsonl")


def test_filter_traces_by_reward(tmp_path):
  traces = load_traces(_jsonl(tmp_path / "t.jsonl", [LUFFY, dict(LUFFY, reward_model={"ground_truth": "6"})]))
  reward = lambda response, answer: float(response.endswith(f"{answer}."))
  kept = filter_traces(traces, reward)
  assert [t.index for t in kept] == [0]
  assert len(filter_traces(traces, reward, min_reward=0.0)) == 2
