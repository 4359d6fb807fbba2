"""Function-calling reward: a JSON tool call checked against OpenAI-style tool schemas.

Call(s): every `<tool_call>...</tool_call>` block, else the last ```json fence, else the first JSON value in
the text. Schemas: `example["tools"]` or `example["functions"]` (a list, or its JSON string), each
`{"name", "description", "parameters": JSON schema}` or `{"type": "function", "function": {...}}`.
Arguments are validated with `jsonschema` (Draft 2020-12: required keys, types, enums, ...).

Per call, additive weights: W_JSON valid JSON object, W_KEYS `name` (str) and `arguments` (object or JSON
string of one), W_TOOL the name is in the schema list, W_REQUIRED all required arguments present,
W_VALID no schema error at all. Score = mean over calls (0 when none parses). When the example holds the
expected call(s) (`answer` / `ground_truth`, same formats), score = 0.5 * schema score + 0.5 * [the
multiset of (name, arguments) equals the expected one].
"""
from __future__ import annotations

import json
import re
from typing import Any

import jsonschema

from fineflax.rewards.registry import register

W_JSON, W_KEYS, W_TOOL, W_REQUIRED, W_VALID = 0.2, 0.2, 0.2, 0.2, 0.2
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_JSON_FENCE = re.compile(r"```[ \t]*json[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_DECODER = json.JSONDecoder()


def _first_json(text: str) -> Any:
  for i, ch in enumerate(text):
    if ch in "{[":
      try:
        return _DECODER.raw_decode(text, i)[0]
      except json.JSONDecodeError:
        continue
  raise ValueError("no JSON value")


def extract_calls(text: str) -> list[Any]:
  """Parsed JSON of each call; an unparsable block yields None (it still counts, as a failed call)."""
  blocks = _TOOL_CALL.findall(text) or _JSON_FENCE.findall(text)[-1:]
  sources = [b.strip() for b in blocks] if blocks else [text.strip()]
  calls = []
  for source in sources:
    try:
      value = json.loads(source)
    except json.JSONDecodeError:
      try:
        value = _first_json(source)
      except ValueError:
        value = None
    calls.extend(value if isinstance(value, list) else [value])
  return calls


def tool_schemas(example: dict) -> dict[str, dict]:
  tools = example.get("tools", example.get("functions"))
  if tools is None:
    raise KeyError(f"function_call needs `tools` or `functions` in the example; got keys {sorted(example)}")
  if isinstance(tools, str):
    tools = json.loads(tools)
  out = {}
  for i, tool in enumerate(tools):
    spec = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
      raise ValueError(f"tools[{i}] has no string `name`: {str(tool)[:120]}")
    out[spec["name"]] = spec.get("parameters") or {"type": "object", "properties": {}}
  return out


def _arguments(call: dict) -> dict | None:
  args = call.get("arguments", call.get("parameters"))
  if isinstance(args, str):
    try:
      args = json.loads(args)
    except json.JSONDecodeError:
      return None
  return args if isinstance(args, dict) else None


def score_call(call: Any, schemas: dict[str, dict]) -> float:
  if not isinstance(call, dict):
    return 0.0
  score = W_JSON
  name, args = call.get("name"), _arguments(call)
  if not isinstance(name, str) or args is None:
    return score
  score += W_KEYS
  if name not in schemas:
    return score
  score += W_TOOL
  schema = schemas[name]
  if all(key in args for key in schema.get("required", [])):
    score += W_REQUIRED
  validator = jsonschema.Draft202012Validator(schema)
  if next(validator.iter_errors(args), None) is None:
    score += W_VALID
  return score


def _canonical(calls: list[Any]) -> list[str] | None:
  out = []
  for call in calls:
    if not isinstance(call, dict) or _arguments(call) is None:
      return None
    out.append(json.dumps([call.get("name"), _arguments(call)], sort_keys=True))
  return sorted(out)


@register("function_call")
def function_call_reward(prompt: str, completion: str, **example) -> float:
  del prompt
  schemas = tool_schemas(example)
  calls = [c for c in extract_calls(completion)]
  if not calls or all(c is None for c in calls):
    return 0.0
  schema_score = sum(score_call(c, schemas) for c in calls) / len(calls)
  expected = example.get("answer", example.get("ground_truth"))
  if expected is None:
    return schema_score
  expected_calls = extract_calls(expected) if isinstance(expected, str) else (
      expected if isinstance(expected, list) else [expected])
  got, want = _canonical(calls), _canonical(expected_calls)
  return 0.5 * schema_score + 0.5 * float(got is not None and got == want)
