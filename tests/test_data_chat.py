"""Chat formatting and loss masks: the masked targets decode to exactly the assistant turns (content +
end-of-turn), for every bundled schema with SmolLM2's template (which injects a default system prompt),
and with the ChatML fallback for a tokenizer without a chat template."""
import json
import re

import pytest

from fineflax.data import CHATML_TEMPLATE, load_source, render_with_spans, sample_file, tokenize_chat
from fineflax.data.packing import shift

SAMPLES = ["arithmetic_messages.jsonl", "units_sharegpt.json", "world_alpaca.jsonl",
           "strings_prompt_completion.csv", "tools_glaive.jsonl"]


@pytest.fixture(scope="module")
def smol():
  from fineflax.models import load_tokenizer
  return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def tiny():
  """A byte-level BPE tokenizer trained here, with no chat template."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["What is 17 + 25? 17 + 25 = 42.", "Convert 3 km to m. 3 km = 3000 m."] * 20,
                          trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")
  assert not fast.chat_template
  return fast


def masked_runs(tokenizer, messages):
  """Decoded runs of consecutive loss-masked targets, after the next-token shift."""
  ids, assistant = tokenize_chat(tokenizer, messages)
  _, targets, loss = shift(ids, assistant)
  runs, current = [], []
  for t, m in zip(targets, loss):
    if m:
      current.append(int(t))
    elif current:
      runs.append(current)
      current = []
  if current:
    runs.append(current)
  return [tokenizer.decode(r) for r in runs], ids


def expected_turns(messages, eot="<|im_end|>"):
  """Assistant contents as rendered (tool calls as <tool_call> blocks, built here independently) + eot."""
  out = []
  for m in messages:
    if m["role"] != "assistant":
      continue
    parts = [m["content"]] if m["content"] else []
    for c in m.get("tool_calls", []):
      call = {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
      parts.append("<tool_call>\n" + json.dumps(call) + "\n</tool_call>")
    out.append("\n".join(parts) + eot)
  return out


@pytest.mark.parametrize("name", SAMPLES)
def test_masks_cover_exactly_the_assistant_turns(smol, name):
  src = load_source(sample_file(name))
  multi = [i for i in range(len(src)) if sum(m["role"] == "assistant" for m in src[i]["messages"]) > 1]
  for i in [0, 1, 2] + multi[:2]:
    msgs = src[i]["messages"]
    runs, ids = masked_runs(smol, msgs)
    assert runs == expected_turns(msgs), (name, i)
    text, _ = render_with_spans(smol, msgs)
    assert smol.decode(ids) == text  # every token is accounted for; nothing else is masked
    if msgs[0]["role"] != "system":  # SmolLM2 injected its default system prompt, which stays unmasked
      assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_glaive_function_call_is_masked_as_tool_call_block(smol):
  raw = json.loads(sample_file("tools_glaive.jsonl").read_text().splitlines()[0])
  m = re.search(r"<functioncall> \{\"name\": \"(\w+)\", \"arguments\": '(\{.*?\})'\}", raw["chat"])
  src = load_source(sample_file("tools_glaive.jsonl"))
  runs, _ = masked_runs(smol, src[0]["messages"])
  call = json.dumps({"name": m.group(1), "arguments": json.loads(m.group(2))})
  assert runs[0] == f"<tool_call>\n{call}\n</tool_call><|im_end|>"
  assert "FUNCTION RESPONSE" not in "".join(runs) and len(runs) == 2


def test_assistant_first_and_system_given(smol):
  msgs = [{"role": "assistant", "content": "Hello, ask me a sum."}, {"role": "user", "content": "1 + 1?"},
          {"role": "assistant", "content": "1 + 1 = 2."}]
  assert masked_runs(smol, msgs)[0] == ["Hello, ask me a sum.<|im_end|>", "1 + 1 = 2.<|im_end|>"]
  msgs = [{"role": "system", "content": "Be terse."}] + msgs[1:]
  runs, ids = masked_runs(smol, msgs)
  assert runs == ["1 + 1 = 2.<|im_end|>"]
  assert "SmolLM" not in smol.decode(ids)


def test_chatml_fallback_without_chat_template(tiny):
  msgs = [{"role": "system", "content": "Sums."}, {"role": "user", "content": "What is 17 + 25?"},
          {"role": "assistant", "content": "17 + 25 = 42."}, {"role": "user", "content": "And 3 km?"},
          {"role": "assistant", "content": "3 km = 3000 m."}]
  text, _ = render_with_spans(tiny, msgs)
  assert text == ("<|im_start|>system\nSums.<|im_end|>\n<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n"
                  "<|im_start|>assistant\n17 + 25 = 42.<|im_end|>\n<|im_start|>user\nAnd 3 km?<|im_end|>\n"
                  "<|im_start|>assistant\n3 km = 3000 m.<|im_end|>\n")
  runs, ids = masked_runs(tiny, msgs)
  assert runs == ["17 + 25 = 42.<|im_end|>", "3 km = 3000 m.<|im_end|>"]
  assert tiny.decode(ids) == text
  assert "im_start" in CHATML_TEMPLATE


def test_template_that_renders_tool_calls_gets_them_unchanged(tiny):
  import copy
  tok = copy.deepcopy(tiny)
  tok.chat_template = (
      "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
      "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}CALL {{ c['function']['name'] }}"
      "{% endfor %}{% endif %}</s>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
  msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "wx", "arguments": "{}"}}]}]
  assert masked_runs(tok, msgs)[0] == ["CALL wx</s>"]
