"""Tool calls through real chat templates: the text fineflax renders for a row (OpenAI tool_calls, ShareGPT
function_call, glaive) equals `tokenizer.apply_chat_template` of the messages written out by hand with the
arguments as objects, for SmolLM2's bundled template and the published Qwen2.5-Instruct and
Llama-3.1-Instruct templates (tests/fixtures/*.jinja, copied from the models' tokenizer_config.json), and
the trained tokens are exactly the assistant turns. Before the fix, Qwen2.5 and Llama-3.1 were trained on
doubly encoded arguments (`"arguments": "{\\"city\\": ...}"`)."""
import json
import pathlib

import pytest

from fineflax.data import load_source, render_with_spans, to_messages, tokenize_chat
from fineflax.data.chat import arguments_as_objects
from fineflax.data.packing import shift

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
TEMPLATES = {"qwen2.5": (FIXTURES / "qwen2.5_instruct.jinja").read_text(),
             "llama3.1": (FIXTURES / "llama3.1_instruct.jinja").read_text(),
             "smollm2": None}  # None: the bundled template
EOT = {"qwen2.5": "<|im_end|>", "llama3.1": "<|eot_id|>", "smollm2": "<|im_end|>"}

WEATHER = {"city": "Oslo", "unit": "celsius"}
CONVERT = {"value": 3, "from": "km", "to": "mi"}
CROWNS = {"amount": 66, "currency": "GBP"}

ROWS = {
    "openai": ({"messages": [
        {"role": "system", "content": "You can look up the weather."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps(WEATHER)}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 3}"},
        {"role": "assistant", "content": "It is 3 °C in Oslo."}]}, "messages",
        [{"role": "system", "content": "You can look up the weather."},
         {"role": "user", "content": "Weather in Oslo?"},
         {"role": "assistant", "content": "", "tool_calls": [
             {"type": "function", "function": {"name": "get_weather", "arguments": WEATHER}}]},
         {"role": "tool", "content": "{\"temp_c\": 3}"},
         {"role": "assistant", "content": "It is 3 °C in Oslo."}]),
    "sharegpt": ({"conversations": [
        {"from": "human", "value": "Convert 3 km to miles."},
        {"from": "function_call", "value": json.dumps({"name": "convert", "arguments": CONVERT})},
        {"from": "observation", "value": "{\"result\": 1.864}"},
        {"from": "gpt", "value": "3 km is about 1.86 miles."}]}, "sharegpt",
        [{"role": "user", "content": "Convert 3 km to miles."},
         {"role": "assistant", "content": "", "tool_calls": [
             {"type": "function", "function": {"name": "convert", "arguments": CONVERT}}]},
         {"role": "tool", "content": "{\"result\": 1.864}"},
         {"role": "assistant", "content": "3 km is about 1.86 miles."}]),
    "glaive": ({"system": "SYSTEM: You are a helpful assistant with access to convert_to_crowns.",
                "chat": "USER: How many crowns is 66 GBP?\n\n\nASSISTANT: <functioncall> {\"name\": "
                        "\"convert_to_crowns\", \"arguments\": '{\"amount\": 66, \"currency\": \"GBP\"}'} "
                        "<|endoftext|>\n\n\nFUNCTION RESPONSE: {\"crowns\": 330}\n\n\nASSISTANT: 66 GBP is 330 "
                        "crowns. <|endoftext|>"}, "glaive",
               [{"role": "system", "content": "You are a helpful assistant with access to convert_to_crowns."},
                {"role": "user", "content": "How many crowns is 66 GBP?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "convert_to_crowns", "arguments": CROWNS}}]},
                {"role": "tool", "content": "{\"crowns\": 330}"},
                {"role": "assistant", "content": "66 GBP is 330 crowns."}]),
}


@pytest.fixture(scope="module")
def tokenizers():
  """The bundled SmolLM2 tokenizer, and copies of it carrying the Qwen2.5 / Llama-3.1 templates (the
  Llama copy also gets Llama-3's special tokens, so that token boundaries fall where Llama's do)."""
  from fineflax.models import load_tokenizer
  out = {}
  for name, template in TEMPLATES.items():
    tok = load_tokenizer("smollm2-135m-instruct")
    if template is not None:
      tok.chat_template = template
    if name == "llama3.1":
      tok.add_special_tokens({"bos_token": "<|begin_of_text|>", "additional_special_tokens": [
          "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]})
    out[name] = tok
  return out


def inline_calls(messages):
  """SmolLM2's template cannot render tool_calls: the calls become `<tool_call>` blocks in the content
  (fineflax's convention), written here independently of fineflax.data.chat."""
  out = []
  for m in messages:
    m = dict(m)
    calls = m.pop("tool_calls", None)
    if calls:
      blocks = ["<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                               "arguments": c["function"]["arguments"]},
                                              ensure_ascii=False) + "\n</tool_call>" for c in calls]
      m["content"] = "\n".join(([m["content"]] if m["content"] else []) + blocks)
    out.append(m)
  return out


def masked_text(tok, messages):
  """The loss-masked targets decoded, run by run."""
  ids, assistant = tokenize_chat(tok, messages)
  _, targets, loss = shift(ids, assistant)
  runs, cur = [], []
  for t, m in zip(targets.tolist(), loss.tolist()):
    if m:
      cur.append(t)
    elif cur:
      runs.append(tok.decode(cur))
      cur = []
  return runs + ([tok.decode(cur)] if cur else [])


@pytest.mark.parametrize("template", list(TEMPLATES))
@pytest.mark.parametrize("kind", list(ROWS))
def test_rendered_text_equals_apply_chat_template_of_expected_messages(tokenizers, template, kind):
  tok = tokenizers[template]
  row, schema, expected = ROWS[kind]
  messages = to_messages(row, schema)
  text, _ = render_with_spans(tok, messages)
  reference = expected if template != "smollm2" else inline_calls(expected)
  assert text == tok.apply_chat_template(reference, tokenize=False)
  args = json.dumps(expected[[m["role"] for m in expected].index("assistant")]["tool_calls"][0]
                    ["function"]["arguments"])
  key = "parameters" if template == "llama3.1" else "arguments"
  assert f'"{key}": {args}' in text  # the object itself, not a JSON string of it
  runs = masked_text(tok, messages)
  assistant_turns = [m for m in expected if m["role"] == "assistant"]
  assert len(runs) == len(assistant_turns)
  assert all(r.endswith(EOT[template]) for r in runs)
  assert args in runs[0] and assistant_turns[-1]["content"] in runs[-1]


def test_bundled_glaive_rows_render_objects_for_qwen(tokenizers):
  src = load_source("sample:tools_glaive.jsonl")
  tok = tokenizers["qwen2.5"]
  for i in range(3):
    msgs = src[i]["messages"]
    text, _ = render_with_spans(tok, msgs)
    expected = [dict(m, tool_calls=[{"type": "function", "function": {
        "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in m["tool_calls"]]) if m.get("tool_calls") else m for m in msgs]
    assert text == tok.apply_chat_template(expected, tokenize=False)
    assert '"arguments": "' not in text


def test_templates_that_branch_on_string_arguments_keep_strings(tokenizers):
  """A Qwen3-style template prints string arguments verbatim: the row's own JSON text is kept."""
  qwen3_like = (
      "{%- for m in messages %}<{{ m.role }}>{{ m.content }}{%- for c in m.tool_calls or [] %}"
      "{%- if c.function.arguments is string %}{{ c.function.arguments }}"
      "{%- else %}{{ c.function.arguments | tojson }}{%- endif %}{%- endfor %}</s>{%- endfor %}"
      "{%- if add_generation_prompt %}<assistant>{%- endif %}")
  assert not arguments_as_objects(qwen3_like)
  assert arguments_as_objects(TEMPLATES["qwen2.5"]) and arguments_as_objects(TEMPLATES["llama3.1"])
  import copy
  tok = copy.deepcopy(tokenizers["smollm2"])
  tok.chat_template = qwen3_like
  raw = '{"city":"Oslo"}'  # compact, as the row wrote it
  msgs = to_messages({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
                                    "tool_calls": [{"function": {"name": "w", "arguments": raw}}]}]},
                     "messages")
  assert render_with_spans(tok, msgs)[0] == "<user>q</s><assistant>" + raw + "</s>"
