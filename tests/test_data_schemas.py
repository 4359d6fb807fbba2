"""Schema mapping: every supported row layout -> canonical messages; detection; row errors."""
import json

import pytest

from fineflax.data.schemas import RowError, detect_schema, parse_glaive_call, to_messages

pytestmark = pytest.mark.fast


def test_detect_schema_from_columns():
  assert detect_schema(["messages", "id"]) == "messages"
  assert detect_schema(["conversations", "system"]) == "sharegpt"
  assert detect_schema(["instruction", "input", "output"]) == "alpaca"
  assert detect_schema(["instruction", "output"]) == "alpaca"  # Evol-Instruct
  assert detect_schema(["prompt", "completion"]) == "prompt_completion"
  assert detect_schema(["system", "chat"]) == "glaive"
  with pytest.raises(RowError, match=r"cannot detect.*\['question', 'text'\]"):
    detect_schema(["text", "question"])


def test_messages_content_parts_and_tool_calls():
  row = {"messages": [
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": None,
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": None}}}]},
      {"role": "tool", "content": "42", "name": "f"},
      {"role": "assistant", "content": "It is 42.", "name": None}]}
  msgs = to_messages(row, "messages")
  assert msgs[0] == {"role": "user", "content": "Hi there"}
  # None-valued argument keys (Arrow struct unification) are dropped; arguments become a JSON string.
  assert json.loads(msgs[1]["tool_calls"][0]["function"]["arguments"]) == {"a": 1}
  assert msgs[2] == {"role": "tool", "content": "42", "name": "f"}
  assert msgs[3] == {"role": "assistant", "content": "It is 42."}


def test_sharegpt_roles_and_function_call():
  row = {"system": "Be brief.", "conversations": [
      {"from": "human", "value": "Weather?"},
      {"from": "function_call", "value": json.dumps({"name": "wx", "arguments": {"city": "Oslo"}})},
      {"from": "observation", "value": "{\"t\": 3}"},
      {"from": "gpt", "value": "3 degrees."}]}
  msgs = to_messages(row, "sharegpt")
  assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
  call = msgs[2]["tool_calls"][0]["function"]
  assert call["name"] == "wx" and json.loads(call["arguments"]) == {"city": "Oslo"}
  with pytest.raises(RowError, match=r"conversations\[0\]\.from: 'robot'"):
    to_messages({"conversations": [{"from": "robot", "value": "x"}]}, "sharegpt")


def test_alpaca_with_and_without_input():
  with_input = to_messages({"instruction": "Add.", "input": "2 and 3", "output": "5"}, "alpaca")
  assert with_input == [{"role": "user", "content": "Add.\n\n2 and 3"}, {"role": "assistant", "content": "5"}]
  evol = to_messages({"instruction": "Say hi.", "output": "hi"}, "alpaca")
  assert evol == [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]
  with pytest.raises(RowError, match="no assistant turn"):
    to_messages({"instruction": "Say hi.", "output": "  "}, "alpaca")


def test_prompt_completion_plain_and_conversational():
  plain = to_messages({"prompt": "Q?", "completion": "A."}, "prompt_completion")
  assert plain == [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
  conv = to_messages({"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q?"}],
                      "completion": [{"role": "assistant", "content": "A."}]}, "prompt_completion")
  assert [m["role"] for m in conv] == ["system", "user", "assistant"]


def test_glaive_turns_and_function_call():
  args = {"harbor": "Dunmere", "hour": 7}
  chat = ("USER: Tide at Dunmere at 7?\n\n\nASSISTANT: <functioncall> "
          f"{{\"name\": \"get_tide_level\", \"arguments\": '{json.dumps(args)}'}} <|endoftext|>\n\n\n"
          "FUNCTION RESPONSE: {\"level_m\": 2.5}\n\n\nASSISTANT: It is 2.5 m. <|endoftext|>\n\n\n")
  msgs = to_messages({"system": "SYSTEM: You can call get_tide_level.", "chat": chat}, "glaive")
  assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
  assert msgs[0]["content"] == "You can call get_tide_level."
  fn = msgs[2]["tool_calls"][0]["function"]
  assert fn["name"] == "get_tide_level" and json.loads(fn["arguments"]) == args
  assert msgs[2]["content"] == "" and msgs[3]["content"] == "{\"level_m\": 2.5}"
  assert msgs[4]["content"] == "It is 2.5 m."
  with pytest.raises(RowError, match="not a JSON object"):
    parse_glaive_call("{name: broken", "chat turn 1")


def test_row_errors_name_the_field():
  with pytest.raises(RowError, match=r"messages\[1\]\.role: 'robot'"):
    to_messages({"messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}]},
                "messages")
  with pytest.raises(RowError, match=r"messages\[0\]: missing 'content'"):
    to_messages({"messages": [{"role": "user"}]}, "messages")
  with pytest.raises(RowError, match=r"arguments are not valid JSON"):
    to_messages({"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": "{oops"}}]}]}, "messages")
