"""Off-policy reasoning traces (LUFFY guidance data) from JSON, JSONL or Parquet.

Accepted record formats (one record per JSONL line / JSON list item / Parquet row):
- LUFFY:  {"prompt": [{"role": "user", "content": q}, ...],
           "target": [{"role": "assistant", "content": "<think>...</think>answer"}, ...] (or a str),
           "reward_model": {"ground_truth": a, ...}, ...}
- plain:  {"question": q, "response" | "reasoning": text, "answer": a}
Either may carry "behaviour_logp": [float per response token] (the behaviour policy's log-probs).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Callable, Iterable, Iterator, Optional

from fineflax.io import atomic_write_text


class TraceFormatError(ValueError):
  """A trace file or record that does not follow one of the accepted formats."""


@dataclasses.dataclass
class Trace:
  """One off-policy trace, normalised.

  question: the last user turn; messages: the prompt as chat messages [{role, content}];
  response: the assistant text (target messages joined by "\\n"); answer: ground truth (str);
  behaviour_logp: optional per-token behaviour log-probs; source/index: file and record number.
  """
  question: str
  messages: list
  response: str
  answer: str
  behaviour_logp: Optional[list] = None
  source: str = ""
  index: int = -1


def _fail(where: str, msg: str):
  raise TraceFormatError(f"{where}: {msg}")


def _text(value, where: str, field: str) -> str:
  if not isinstance(value, str) or not value.strip():
    _fail(where, f"field {field!r} must be a non-empty string, got {value!r:.80}")
  return value


def _messages(value, where: str, field: str) -> list:
  if isinstance(value, str):
    return [{"role": "user" if field == "prompt" else "assistant", "content": _text(value, where, field)}]
  if not isinstance(value, (list, tuple)) or not value:
    _fail(where, f"field {field!r} must be a non-empty list of chat messages, got {value!r:.80}")
  out = []
  for i, m in enumerate(value):
    if not isinstance(m, dict) or "role" not in m or "content" not in m:
      _fail(where, f"field {field!r}[{i}] must be a message {{'role', 'content'}}, got {m!r:.80}")
    out.append({"role": str(m["role"]), "content": _text(m["content"], where, f"{field}[{i}].content")})
  return out


def _answer(value, where: str, field: str) -> str:
  if value is None or (isinstance(value, str) and not value.strip()):
    _fail(where, f"missing field {field!r}")
  if isinstance(value, (list, tuple)) and len(value) == 1:
    value = value[0]
  return str(value)


def parse_record(record, where: str, source: str = "", index: int = -1) -> Trace:
  """One record (dict) -> Trace; `where` (e.g. "file.jsonl: line 3") prefixes every error."""
  if not isinstance(record, dict):
    _fail(where, f"record must be an object, got {type(record).__name__}")
  logp = record.get("behaviour_logp")
  if logp is not None:
    try:
      logp = [float(x) for x in logp]
    except (TypeError, ValueError):
      _fail(where, f"field 'behaviour_logp' must be a list of numbers, got {logp!r:.80}")
  if "prompt" in record:
    for field in ("target", "reward_model"):
      if record.get(field) is None:
        _fail(where, f"missing field {field!r} (LUFFY format)")
    messages = _messages(record["prompt"], where, "prompt")
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users:
      _fail(where, "field 'prompt' has no user message")
    response = "\n".join(m["content"] for m in _messages(record["target"], where, "target"))
    rm = record["reward_model"]
    if not isinstance(rm, dict):
      _fail(where, f"field 'reward_model' must be an object, got {rm!r:.80}")
    answer = _answer(rm.get("ground_truth"), where, "reward_model.ground_truth")
    return Trace(users[-1], messages, response, answer, logp, source, index)
  if "question" in record:
    question = _text(record["question"], where, "question")
    key = "response" if record.get("response") is not None else "reasoning"
    if record.get(key) is None:
      _fail(where, "missing field 'response' (or 'reasoning')")
    response = _text(record[key], where, key)
    answer = _answer(record.get("answer"), where, "answer")
    return Trace(question, [{"role": "user", "content": question}], response, answer, logp, source, index)
  _fail(where, f"unknown record format (keys {sorted(record)[:8]}): need LUFFY fields 'prompt', "
               "'target', 'reward_model' or plain fields 'question', 'response'|'reasoning', 'answer'")


def _records(path: pathlib.Path) -> Iterator[tuple[str, dict]]:
  """(location, record) pairs of a .jsonl, .json or .parquet file."""
  suffix = path.suffix.lower()
  if suffix == ".jsonl":
    with open(path, encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        if line.strip():
          try:
            yield f"{path}: line {n}", json.loads(line)
          except json.JSONDecodeError as e:
            _fail(f"{path}: line {n}", f"invalid JSON ({e.msg} at column {e.colno})")
  elif suffix == ".json":
    try:
      data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
      _fail(str(path), f"invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})")
    if isinstance(data, dict) and isinstance(data.get("data"), list):
      data = data["data"]
    if not isinstance(data, list):
      _fail(str(path), "a .json trace file must hold a list of records (or {'data': [...]})")
    for i, rec in enumerate(data):
      yield f"{path}: record {i}", rec
  elif suffix == ".parquet":
    import pyarrow.parquet as pq
    for i, rec in enumerate(pq.read_table(path).to_pylist()):
      yield f"{path}: row {i}", rec
  else:
    _fail(str(path), f"unsupported trace file type {suffix!r} (expected .jsonl, .json or .parquet)")


def load_traces(path) -> list[Trace]:
  """All traces of one file, in file order; raises TraceFormatError naming file, record and field."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"trace file not found: {path}")
  return [parse_record(rec, where, str(path), i) for i, (where, rec) in enumerate(_records(path))]


def filter_traces(traces: Iterable[Trace], reward_fn: Callable[[str, str], float],
                  min_reward: float = 1.0) -> list[Trace]:
  """Traces whose reward_fn(response, answer) >= min_reward (e.g. keep only verified-correct ones)."""
  return [t for t in traces if reward_fn(t.response, t.answer) >= min_reward]


def write_luffy_jsonl(path, rows, data_source: str) -> pathlib.Path:
  """Writes (question, response, answer, extra_info) rows as LUFFY-format JSONL, atomically."""
  lines = [json.dumps({"data_source": data_source, "prompt": [{"role": "user", "content": question}],
                       "target": [{"role": "assistant", "content": response}], "ability": "math",
                       "reward_model": {"style": "rule", "ground_truth": str(answer)},
                       "extra_info": {"index": i, **(extra or {})}}) + "\n"
           for i, (question, response, answer, extra) in enumerate(rows)]
  return atomic_write_text(path, "".join(lines))
