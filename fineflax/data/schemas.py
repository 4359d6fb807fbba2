"""Row schemas -> one message format.

A message is `{"role": "system"|"user"|"assistant"|"tool", "content": str}` plus, optionally,
`"tool_calls": [{"type": "function", "function": {"name": str, "arguments": str (JSON)}}]` (assistant) and
`"name": str` (tool). Tool-call arguments are kept as a JSON string, as in the OpenAI API: Arrow unifies
struct fields across rows, so dict arguments read back through `datasets` gain the other rows' keys as
None; `_arguments_json` drops None values when it serialises a dict. `fineflax.data.chat` decodes them
again for templates that JSON-encode arguments themselves (Qwen2.5, Llama-3.1).

Schemas (detected from the columns by `detect_schema`, or named in the config):

  messages           `messages`: [{"role", "content", "tool_calls"?, "name"?}]          (OpenAI chat)
  sharegpt           `conversations`: [{"from", "value"}], from in human/gpt/system/function_call/
                     observation (also user/assistant/tool/function); optional `system` column
  alpaca             `instruction`, `output`, optional `input` and `system` (Alpaca, Evol-Instruct)
  prompt_completion  `prompt`, `completion` (strings, or lists of messages as in TRL)
  glaive             `system` ("SYSTEM: ..." with function definitions) and `chat` ("USER: ...",
                     "ASSISTANT: ...", "<functioncall> {...}", "FUNCTION RESPONSE: ..." turns)

Every converter raises `RowError` with a message naming the field at fault; a row without an assistant
turn with content or tool calls is an error (it has nothing to learn).
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any, Callable, Mapping

from fineflax.io import json_error

ROLES = ("system", "user", "assistant", "tool")
REQUIRED_COLUMNS = {
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "alpaca": ("instruction", "output"),
    "prompt_completion": ("prompt", "completion"),
    "glaive": ("chat",),
}
SCHEMAS = tuple(REQUIRED_COLUMNS)
SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system",
    "function_call": "assistant", "observation": "tool", "function": "tool", "tool": "tool",
}


class RowError(ValueError):
  """A row that does not fit its schema; the message names the field and value at fault."""


def detect_schema(columns) -> str:
  """The schema whose required columns are present (checked in the order of `SCHEMAS`)."""
  cols = set(columns)
  for name, required in REQUIRED_COLUMNS.items():
    if set(required) <= cols:
      return name
  raise RowError(f"cannot detect the schema from columns {sorted(cols)}; expected one of "
                 + "; ".join(f"{n}: {list(r)}" for n, r in REQUIRED_COLUMNS.items()))


def missing_columns(schema: str, columns) -> list[str]:
  if schema not in REQUIRED_COLUMNS:
    raise ValueError(f"schema={schema!r}; choose 'auto' or one of {list(SCHEMAS)}")
  return [c for c in REQUIRED_COLUMNS[schema] if c not in set(columns)]


def _text(value, field: str) -> str:
  """A content value as a string: str, None -> "", or a list of {"type": "text", "text"} parts."""
  if value is None:
    return ""
  if isinstance(value, str):
    return value
  if isinstance(value, list) and all(isinstance(p, Mapping) for p in value):
    return "".join(p.get("text") or "" for p in value if p.get("type", "text") == "text")
  raise RowError(f"{field}: expected a string, got {type(value).__name__} {str(value)[:60]!r}")


def _drop_none(x):
  if isinstance(x, Mapping):
    return {k: _drop_none(v) for k, v in x.items() if v is not None}
  if isinstance(x, list):
    return [_drop_none(v) for v in x]
  return x


def _arguments_json(args, field: str) -> str:
  if args is None:
    return "{}"
  if isinstance(args, str):
    try:
      json.loads(args)
    except json.JSONDecodeError as e:
      raise RowError(f"{field}: arguments are not valid JSON ({json_error(e)}): {args[:60]!r}") from None
    return args
  if isinstance(args, Mapping):
    return json.dumps(_drop_none(args), ensure_ascii=False)
  raise RowError(f"{field}: arguments must be a JSON string or an object, got {type(args).__name__}")


def tool_call(name, arguments, field: str = "tool_call") -> dict:
  if not isinstance(name, str) or not name:
    raise RowError(f"{field}: tool call without a function name ({name!r})")
  return {"type": "function", "function": {"name": name, "arguments": _arguments_json(arguments, field)}}


def _tool_calls(calls, field: str) -> list[dict]:
  if not isinstance(calls, list):
    raise RowError(f"{field}: expected a list of tool calls, got {type(calls).__name__}")
  out = []
  for j, c in enumerate(calls):
    if not isinstance(c, Mapping):
      raise RowError(f"{field}[{j}]: expected an object, got {type(c).__name__}")
    fn = c.get("function") if c.get("function") is not None else c
    out.append(tool_call(fn.get("name"), fn.get("arguments"), f"{field}[{j}]"))
  return out


def message(role: str, content: str, **extra) -> dict:
  m = {"role": role, "content": content}
  m.update({k: v for k, v in extra.items() if v})
  return m


def _check(messages: list[dict], where: str) -> list[dict]:
  if not any(m["role"] == "assistant" and (m["content"].strip() or m.get("tool_calls")) for m in messages):
    raise RowError(f"{where}: no assistant turn with content or tool calls")
  return messages


def _chat_list(value, field: str) -> list[dict]:
  """OpenAI-style messages -> canonical messages."""
  if not isinstance(value, list) or not value:
    raise RowError(f"{field}: expected a non-empty list of messages, got {str(value)[:60]!r}")
  out = []
  for i, m in enumerate(value):
    f = f"{field}[{i}]"
    if not isinstance(m, Mapping):
      raise RowError(f"{f}: expected an object with 'role' and 'content', got {type(m).__name__}")
    role = m.get("role")
    if role not in ROLES:
      raise RowError(f"{f}.role: {role!r} is not one of {list(ROLES)}")
    calls = _tool_calls(m["tool_calls"], f"{f}.tool_calls") if m.get("tool_calls") else None
    if "content" not in m and not calls:
      raise RowError(f"{f}: missing 'content'")
    out.append(message(role, _text(m.get("content"), f"{f}.content"), tool_calls=calls, name=m.get("name")))
  return out


def from_messages(row: Mapping[str, Any]) -> list[dict]:
  return _check(_chat_list(row.get("messages"), "messages"), "messages")


def from_sharegpt(row: Mapping[str, Any]) -> list[dict]:
  conv = row.get("conversations")
  if not isinstance(conv, list) or not conv:
    raise RowError(f"conversations: expected a non-empty list of turns, got {str(conv)[:60]!r}")
  out = [message("system", row["system"])] if row.get("system") else []
  for i, turn in enumerate(conv):
    f = f"conversations[{i}]"
    if not isinstance(turn, Mapping):
      raise RowError(f"{f}: expected an object with 'from' and 'value', got {type(turn).__name__}")
    src = turn.get("from", turn.get("role"))
    value = _text(turn.get("value", turn.get("content")), f"{f}.value")
    if src not in SHAREGPT_ROLES:
      raise RowError(f"{f}.from: {src!r} is not one of {sorted(SHAREGPT_ROLES)}")
    if src == "function_call":
      try:
        call = json.loads(value)
      except json.JSONDecodeError as e:
        raise RowError(f"{f}.value: function_call is not valid JSON ({json_error(e)}): "
                       f"{value[:60]!r}") from None
      calls = call if isinstance(call, list) else [call]
      out.append(message("assistant", "", tool_calls=_tool_calls(calls, f"{f}.value")))
    else:
      out.append(message(SHAREGPT_ROLES[src], value))
  return _check(out, "conversations")


def from_alpaca(row: Mapping[str, Any]) -> list[dict]:
  instruction = _text(row.get("instruction"), "instruction").strip()
  extra = _text(row.get("input"), "input").strip()
  output = _text(row.get("output"), "output")
  if not instruction:
    raise RowError("instruction: empty")
  out = [message("system", row["system"])] if row.get("system") else []
  out.append(message("user", f"{instruction}\n\n{extra}" if extra else instruction))
  out.append(message("assistant", output))
  return _check(out, "output")


def from_prompt_completion(row: Mapping[str, Any]) -> list[dict]:
  prompt, completion = row.get("prompt"), row.get("completion")
  prompt_msgs = (_chat_list(prompt, "prompt") if isinstance(prompt, list)
                 else [message("user", _text(prompt, "prompt"))])
  if not any(m["content"].strip() for m in prompt_msgs):
    raise RowError("prompt: empty")
  completion_msgs = (_chat_list(completion, "completion") if isinstance(completion, list)
                     else [message("assistant", _text(completion, "completion"))])
  return _check(prompt_msgs + completion_msgs, "completion")


_GLAIVE_TURN = re.compile(r"(USER:|ASSISTANT:|FUNCTION RESPONSE:)")
_GLAIVE_ROLES = {"USER:": "user", "ASSISTANT:": "assistant", "FUNCTION RESPONSE:": "tool"}


def parse_glaive_call(text: str, field: str) -> dict:
  """`{"name": "f", "arguments": '{"a": 1}'}` (Glaive quotes the arguments with ') -> a tool call."""
  text = text.strip()
  try:
    call = json.loads(text)
  except json.JSONDecodeError:
    fixed = re.sub(r"'(\{.*\})'", lambda m: json.dumps(m.group(1)), text, flags=re.S)
    try:
      call = json.loads(fixed)
    except json.JSONDecodeError:
      try:
        call = ast.literal_eval(text)
      except (ValueError, SyntaxError):
        raise RowError(f"{field}: <functioncall> is not a JSON object: {text[:80]!r}") from None
  if not isinstance(call, Mapping):
    raise RowError(f"{field}: <functioncall> is not a JSON object: {text[:80]!r}")
  return tool_call(call.get("name"), call.get("arguments"), field)


def from_glaive(row: Mapping[str, Any]) -> list[dict]:
  system = _text(row.get("system"), "system").strip()
  system = re.sub(r"^SYSTEM:\s*", "", system)
  chat = _text(row.get("chat"), "chat")
  parts = _GLAIVE_TURN.split(chat)
  if parts[0].strip():
    raise RowError(f"chat: text before the first USER:/ASSISTANT: marker: {parts[0].strip()[:60]!r}")
  out = [message("system", system)] if system else []
  for k in range(1, len(parts), 2):
    role = _GLAIVE_ROLES[parts[k]]
    body = parts[k + 1].replace("<|endoftext|>", "").strip()
    field = f"chat turn {k // 2} ({parts[k]})"
    if role == "assistant" and "<functioncall>" in body:
      before, _, call = body.partition("<functioncall>")
      out.append(message("assistant", before.strip(), tool_calls=[parse_glaive_call(call, field)]))
    else:
      out.append(message(role, body))
  return _check(out, "chat")


CONVERTERS: dict[str, Callable[[Mapping[str, Any]], list[dict]]] = {
    "messages": from_messages,
    "sharegpt": from_sharegpt,
    "alpaca": from_alpaca,
    "prompt_completion": from_prompt_completion,
    "glaive": from_glaive,
}


def to_messages(row: Mapping[str, Any], schema: str) -> list[dict]:
  """The canonical message list of one row of `schema` (raises RowError)."""
  if not isinstance(row, Mapping):
    raise RowError(f"expected an object per row, got {type(row).__name__}")
  return CONVERTERS[schema](row)
