"""Function-call reward against OpenAI-style schemas."""
import json

import pytest

from fineflax.rewards import get_reward
from fineflax.rewards.function_call import W_JSON, W_KEYS, W_REQUIRED, W_TOOL

pytestmark = pytest.mark.fast

TOOLS = [{"type": "function", "function": {
    "name": "book_flight", "description": "Book a flight",
    "parameters": {"type": "object", "required": ["origin", "dest"], "additionalProperties": False,
                   "properties": {"origin": {"type": "string"}, "dest": {"type": "string"},
                                  "seats": {"type": "integer"}, "cabin": {"enum": ["economy", "business"]}}}}},
         {"name": "noop", "description": "nothing", "parameters": {"type": "object", "properties": {}}}]
fc = get_reward("function_call")


@pytest.mark.parametrize("completion,expected", [
    ('{"name": "book_flight", "arguments": {"origin": "OSL", "dest": "LHR", "seats": 2}}', 1.0),
    ('<tool_call>\n{"name": "book_flight", "arguments": "{\\"origin\\": \\"OSL\\", \\"dest\\": \\"LHR\\"}"}\n</tool_call>', 1.0),
    ('Sure:\n```json\n{"name": "noop", "arguments": {}}\n```', 1.0),
    ('{"name": "book_flight", "arguments": {"origin": "OSL", "dest": "LHR", "seats": "two"}}',
     W_JSON + W_KEYS + W_TOOL + W_REQUIRED),  # wrong type
    ('{"name": "book_flight", "arguments": {"origin": "OSL", "dest": "LHR", "cabin": "first"}}',
     W_JSON + W_KEYS + W_TOOL + W_REQUIRED),  # not in enum
    ('{"name": "book_flight", "arguments": {"origin": "OSL"}}', W_JSON + W_KEYS + W_TOOL),  # missing required
    ('{"name": "fly", "arguments": {"origin": "OSL"}}', W_JSON + W_KEYS),  # unknown tool
    ('{"name": "book_flight"}', W_JSON),  # no arguments
    ('{"name": "book_flight", "arguments": {"origin": ', 0.0),  # truncated JSON
    ('<tool_call>{"name": "noop", "arguments": {}}', 1.0),  # unclosed tag: bare JSON found
    ("no call at all", 0.0),
])
def test_schema_scores(completion, expected):
  assert fc("", completion, tools=TOOLS) == pytest.approx(expected)


def test_mean_over_calls_and_string_schema():
  two = ('<tool_call>{"name": "noop", "arguments": {}}</tool_call>'
         '<tool_call>{"name": "fly", "arguments": {}}</tool_call>')
  assert fc("", two, functions=json.dumps(TOOLS)) == pytest.approx((1.0 + W_JSON + W_KEYS) / 2)


def test_expected_call_comparison():
  call = '{"name": "book_flight", "arguments": {"dest": "LHR", "origin": "OSL"}}'
  assert fc("", call, tools=TOOLS, answer='{"name": "book_flight", "arguments": {"origin": "OSL", "dest": "LHR"}}') == 1.0
  assert fc("", call, tools=TOOLS, ground_truth=[{"name": "book_flight", "arguments": {"origin": "OSL", "dest": "CDG"}}]) == 0.5


def test_missing_or_bad_schema_raises_clearly():
  with pytest.raises(KeyError, match="tools"):
    fc("", '{"name": "noop", "arguments": {}}')
  with pytest.raises(ValueError, match=r"tools\[0\]"):
    fc("", '{"name": "noop", "arguments": {}}', tools=[{"description": "nameless"}])
