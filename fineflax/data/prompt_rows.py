"""RL prompt rows: the field map of a file format (`FieldMap`, the built-in `FORMATS`, `field_map`) and the mapping
of one raw row to a `PromptRow` (`map_row`: prompt messages, question, ground truth, data source, optional
off-policy trace, extra reward fields). Reading files into prompt sets is `fineflax.data.rl_prompts`, whose
docstring lists the formats.

A row that cannot be used raises `RowError` naming the field at fault; `rl_prompts` adds the file and row.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from fineflax.data.schemas import RowError

ANSWER_RULES = ("", "gsm8k", "boxed")


@dataclasses.dataclass(frozen=True)
class FieldMap:
  """Where each part of a row lives (dotted paths; "" = not used).

  question / messages: the prompt as text (a user turn) or as chat messages (at least one; with both, the
  messages are the prompt and `question` the row's question text);
  ground_truth: the reference answer (a string, or a list of strings for QA); answer_rule: "" (as is),
  "gsm8k" (the text after "####") or "boxed" (the last \\boxed{} content); data_source: the field naming the
  row's benchmark or source, else every row gets `source_name`; target: the off-policy trace (optional per
  row); reward_kwargs: fields passed to rewards as extra example keys (named by their last path part).
  """
  question: str = ""
  messages: str = ""
  ground_truth: str = ""
  answer_rule: str = ""
  data_source: str = ""
  source_name: str = ""
  target: str = ""
  reward_kwargs: tuple = ()

  def columns(self) -> list[str]:
    """The top-level columns this map reads."""
    paths = [self.question, self.messages, self.ground_truth, self.data_source, self.target, *self.reward_kwargs]
    return sorted({p.split(".")[0] for p in paths if p})


FORMATS = {
    "luffy": FieldMap(messages="prompt", ground_truth="reward_model.ground_truth", data_source="data_source",
                      target="target"),
    "search_r1": FieldMap(question="question", messages="prompt", ground_truth="golden_answers",
                          data_source="data_source"),
    "gsm8k": FieldMap(question="question", ground_truth="answer", answer_rule="gsm8k", source_name="openai/gsm8k"),
    "math": FieldMap(question="problem", ground_truth="solution", answer_rule="boxed", source_name="lighteval/MATH"),
}


def field_map(format: str = "", **overrides) -> FieldMap:
  """A built-in map (`FORMATS`) with `overrides`, or, for format "" / "custom", a map of `overrides` alone;
  ValueError names the bad entry."""
  if format in ("", "custom"):
    base = FieldMap()
  elif format in FORMATS:
    base = FORMATS[format]
  else:
    raise ValueError(f"format={format!r}: choose one of {', '.join(FORMATS)} or 'custom'")
  unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(FieldMap)})
  if unknown:
    raise ValueError(f"unknown field-map key(s) {unknown}; the keys are {[f.name for f in dataclasses.fields(FieldMap)]}")
  overrides = {k: (tuple(v) if k == "reward_kwargs" else v) for k, v in overrides.items() if v is not None}
  fm = dataclasses.replace(base, **overrides)
  if not fm.question and not fm.messages:
    raise ValueError("the field map needs 'question' (a text prompt) or 'messages' (a chat prompt), or both")
  if not fm.ground_truth:
    raise ValueError("the field map needs 'ground_truth' (the field holding the reference answer)")
  if not fm.data_source and not fm.source_name:
    raise ValueError("the field map needs 'data_source' (a field) or 'source_name' (one name for every row)")
  if fm.answer_rule not in ANSWER_RULES:
    raise ValueError(f"answer_rule={fm.answer_rule!r}: choose one of {ANSWER_RULES}")
  return fm


@dataclasses.dataclass
class PromptRow:
  """One RL prompt: `messages` (chat turns, the last a user turn), `question` (that turn's text),
  `ground_truth` (str, or list of str), `data_source`, `target` (the trace text, or None), `reward_kwargs`
  (extra example fields) and `where` ("FILE:row N")."""
  messages: list
  question: str
  ground_truth: Any
  data_source: str
  target: str | None = None
  reward_kwargs: dict = dataclasses.field(default_factory=dict)
  where: str = ""

  def example(self) -> dict:
    """The fields registry rewards read: ground_truth, data_source and the reward kwargs."""
    return {"ground_truth": self.ground_truth, "data_source": self.data_source, **self.reward_kwargs}


_MISSING = object()


def lookup(row: Mapping, path: str):
  """row["a"]["b"] for path "a.b"; _MISSING when a part is absent."""
  value = row
  for part in path.split("."):
    if not isinstance(value, Mapping) or part not in value:
      return _MISSING
    value = value[part]
  return value


def _text(value, field: str) -> str:
  if not isinstance(value, str) or not value.strip():
    raise RowError(f"field {field!r}: expected a non-empty string, got {str(value)[:60]!r}")
  return value


def _messages(value, field: str) -> list[dict]:
  if hasattr(value, "tolist"):  # numpy arrays from pandas-written parquet
    value = value.tolist()
  if not isinstance(value, (list, tuple)) or not value:
    raise RowError(f"field {field!r}: expected a non-empty list of chat messages, got {str(value)[:60]!r}")
  out = []
  for i, m in enumerate(value):
    if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
      raise RowError(f"field {field}[{i}]: expected a message {{'role': str, 'content': str}}, got {str(m)[:60]!r}")
    out.append({"role": m["role"], "content": m["content"]})
  return out


def _ground_truth(value, field: str, rule: str):
  if hasattr(value, "tolist"):
    value = value.tolist()
  if isinstance(value, Mapping) and "target" in value:  # Search-R1's reward_model.ground_truth
    value = value["target"]
    value = value.tolist() if hasattr(value, "tolist") else value
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    value = str(value)
  if isinstance(value, (list, tuple)):
    if not value or not all(isinstance(v, str) and v.strip() for v in value):
      raise RowError(f"field {field!r}: expected a non-empty list of non-empty strings, got {str(value)[:60]!r}")
    return list(value)
  text = _text(value, field)
  if rule == "gsm8k":
    if "####" not in text:
      raise RowError(f"field {field!r}: no '#### answer' line in {text[-60:]!r}")
    return _text(text.rsplit("####", 1)[1].strip().replace(",", ""), field + " (after ####)")
  if rule == "boxed":
    from fineflax.rewards.math_reward import last_boxed
    boxed = last_boxed(text)
    if boxed is None:
      raise RowError(f"field {field!r}: no complete \\boxed{{...}} in {text[-60:]!r}")
    return _text(boxed, field + " (\\boxed content)")
  return text.strip()


def map_row(row: Mapping, fm: FieldMap) -> PromptRow:
  """The PromptRow of one raw row (raises RowError naming the field at fault)."""
  def get(path: str, required: bool = True):
    value = lookup(row, path)
    if value is _MISSING or value is None:
      if required:
        raise RowError(f"field {path!r}: missing")
      return None
    return value

  if fm.messages:
    messages = _messages(get(fm.messages), fm.messages)
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users or messages[-1]["role"] != "user":
      raise RowError(f"field {fm.messages!r}: the last message must be a user turn, got roles "
                     f"{[m['role'] for m in messages]}")
    question = _text(get(fm.question), fm.question) if fm.question else users[-1]
  else:
    question = _text(get(fm.question), fm.question)
    messages = [{"role": "user", "content": question}]
  truth = _ground_truth(get(fm.ground_truth), fm.ground_truth, fm.answer_rule)
  source = _text(get(fm.data_source), fm.data_source) if fm.data_source else fm.source_name
  target = None
  if fm.target:
    value = get(fm.target, required=False)
    if value is not None:
      target = (value if isinstance(value, str) and value.strip()
                else "\n".join(m["content"] for m in _messages(value, fm.target)))
  kwargs = {}
  for path in fm.reward_kwargs:
    value = get(path)
    kwargs[path.split(".")[-1]] = value.tolist() if hasattr(value, "tolist") else value
  return PromptRow(messages, question, truth, source, target, kwargs)
