"""Chat formatting: messages -> token ids and the assistant mask.

Rendering uses the tokenizer's chat template (`tokenizer.apply_chat_template(..., tokenize=False)`), or
`CHATML_TEMPLATE` when the tokenizer has none. Assistant tool calls are written into the content as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` when the template does not mention
`tool_calls` (SmolLM2's, ChatML). Templates that render `tool_calls` themselves get them as structured
calls; the arguments (a JSON string in the canonical messages, see `fineflax.data.schemas`) are passed as
the decoded object when the template JSON-encodes them (`arguments | tojson`, as Qwen2.5-Instruct's and
Llama-3.1-Instruct's do) and it has no branch for string arguments (`arguments is string` / `is mapping`,
as Qwen3's); otherwise (a template that concatenates or special-cases strings) they stay strings. So the
model is trained on `"arguments": {"city": "Oslo"}`, never on the doubly encoded `"{\\"city\\": ...}"`.

Assistant spans by incremental rendering. For assistant message i:

  prefix = render(messages[:i], add_generation_prompt=True)    # ends with the assistant header
  upto   = render(messages[:i+1])                              # ends after the turn's end-of-turn text
  span   = [len(prefix), len(upto.rstrip()))                   # content + end-of-turn, no header

The render of the whole conversation must start with `upto`, and `upto` with `prefix` (templates whose
output for a prefix of the conversation is a prefix of the full output). Default system prompts that a
template injects (SmolLM2 adds one when the first message is not a system message) appear in every
partial render alike, so the offsets stay valid. When `prefix` is not a prefix of `upto` (e.g. an
assistant message first), the span starts at the last occurrence of the rendered content in `upto`.
Trailing whitespace after the end-of-turn token (ChatML's "\\n") is not in the span.

Tokens: the full text is tokenized once, without added special tokens (the template writes them), with
character offsets; token k is an assistant token when its start offset lies in a span.
"""
from __future__ import annotations

import json
import re
from typing import Sequence

import numpy as np

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class TemplateError(ValueError):
  """A chat template whose partial renders are not prefixes of the full render."""


def chat_template(tokenizer) -> str:
  """The tokenizer's template, or ChatML when it has none."""
  template = getattr(tokenizer, "chat_template", None)
  if isinstance(template, dict):
    template = template.get("default") or next(iter(template.values()), None)
  return template or CHATML_TEMPLATE


def tool_call_text(call: dict) -> str:
  fn = call["function"]
  args = fn["arguments"]
  args = json.loads(args) if isinstance(args, str) else args
  return "<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False) + \
      "\n</tool_call>"


_ENCODES_ARGUMENTS = re.compile(r"arguments\s*\|\s*tojson")
_BRANCHES_ON_TYPE = re.compile(r"arguments\s+is\s+(?:not\s+)?(?:string|mapping)")


def arguments_as_objects(template: str) -> bool:
  """Whether `template` wants tool-call arguments as objects: it applies `arguments | tojson` and has no
  `arguments is string` / `arguments is mapping` branch."""
  return bool(_ENCODES_ARGUMENTS.search(template)) and not _BRANCHES_ON_TYPE.search(template)


def _decoded_call(call: dict) -> dict:
  fn = dict(call["function"])
  if isinstance(fn.get("arguments"), str):
    fn["arguments"] = json.loads(fn["arguments"])
  return {**call, "function": fn}


def template_messages(messages: Sequence[dict], template: str) -> list[dict]:
  """Messages as the template receives them: tool calls inlined as text when it cannot render them,
  with decoded arguments when it JSON-encodes them itself (see the module docstring)."""
  if "tool_calls" in template:
    decode = arguments_as_objects(template)
    out = []
    for m in messages:
      m = dict(m)
      if decode and m.get("tool_calls"):
        m["tool_calls"] = [_decoded_call(c) for c in m["tool_calls"]]
      out.append(m)
    return out
  out = []
  for m in messages:
    m = dict(m)
    calls = m.pop("tool_calls", None)
    if calls:
      texts = [tool_call_text(c) for c in calls]
      m["content"] = "\n".join(([m["content"]] if m["content"] else []) + texts)
    out.append(m)
  return out


def _render(tokenizer, template: str, messages, add_generation_prompt: bool = False) -> str:
  return tokenizer.apply_chat_template(list(messages), chat_template=template, tokenize=False,
                                       add_generation_prompt=add_generation_prompt)


def render_with_spans(tokenizer, messages: Sequence[dict]) -> tuple[str, list[tuple[int, int]]]:
  """(full text, [(start, end)] character spans of each assistant turn's content + end-of-turn)."""
  template = chat_template(tokenizer)
  msgs = template_messages(messages, template)
  full = _render(tokenizer, template, msgs)
  spans = []
  for i, m in enumerate(msgs):
    if m["role"] != "assistant":
      continue
    upto = _render(tokenizer, template, msgs[:i + 1])
    if not full.startswith(upto):
      raise TemplateError(f"chat template renders messages[:{i + 1}] differently inside the full "
                          f"conversation; cannot locate assistant turn {i} by incremental rendering")
    prefix = _render(tokenizer, template, msgs[:i], add_generation_prompt=True) if i else None
    end = len(upto.rstrip())
    if prefix is not None and upto.startswith(prefix):
      start = len(prefix)
    else:
      start = upto.rfind(m["content"]) if m["content"] else -1
      if start < 0:
        raise TemplateError(f"cannot locate assistant turn {i} in the rendered text")
    if end > start:
      spans.append((start, end))
  return full, spans


def tokenize_chat(tokenizer, messages: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
  """(ids int32 [n], assistant bool [n]): the rendered conversation and which tokens the assistant wrote."""
  text, spans = render_with_spans(tokenizer, messages)
  enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
  ids = np.asarray(enc["input_ids"], np.int32)
  if "offset_mapping" not in enc:
    raise TypeError(f"{type(tokenizer).__name__} gives no character offsets; use a fast tokenizer")
  starts = np.asarray([a for a, _ in enc["offset_mapping"]], np.int64)
  assistant = np.zeros(len(ids), bool)
  for a, b in spans:
    assistant |= (starts >= a) & (starts < b)
  return ids, assistant
