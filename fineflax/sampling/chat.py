"""Chat prompts for generation: the tokenizer's chat template, or ChatML when it has none.

The template choice and tool-call inlining are `fineflax.data.chat`'s (one rendering for training and
sampling); this adds the generation prompt (the assistant header) for decoding. `chat_prompt_ids` is the one
way to turn messages into the prompt ids of a decode.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from fineflax.data.chat import chat_template, template_messages


def format_chat(tokenizer, messages: Sequence[Mapping], add_generation_prompt: bool = True) -> str:
  """The prompt text for `messages` ([{"role": ..., "content": ...}]) under the tokenizer's template."""
  for i, m in enumerate(messages):
    if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
      raise ValueError(f"messages[{i}] = {m!r}: expected a dict with 'role' and 'content'")
  template = chat_template(tokenizer)
  return tokenizer.apply_chat_template(template_messages(messages, template), chat_template=template,
                                       tokenize=False, add_generation_prompt=add_generation_prompt)


def chat_prompt_ids(tokenizer, messages: Sequence[Mapping], assistant_prefix: str = "") -> list[int]:
  """The token ids a model reads to answer `messages`: `format_chat` (template, then the assistant header),
  then `assistant_prefix` (a prefilled start of the answer), tokenized without added special tokens (the
  template writes them; `encode_plain`)."""
  return encode_plain(tokenizer, format_chat(tokenizer, messages) + assistant_prefix)


def encode_plain(tokenizer, text: str) -> list[int]:
  """tokenizer(text, add_special_tokens=False)["input_ids"]: the fast tokenizer's Rust backend directly when
  it has no truncation or padding set (the Python wrapper then adds nothing but ~0.5 ms a call, a server's
  main cost per short request), the wrapper otherwise. The backend is called through `encode_batch`, which
  releases the GIL (`encode` holds it: a 1 MB prompt then stalls every other thread of a server ~0.5 s)."""
  backend = getattr(tokenizer, "_tokenizer", None)
  if (callable(getattr(backend, "encode_batch", None)) and getattr(backend, "truncation", True) is None
      and getattr(backend, "padding", True) is None):
    return list(backend.encode_batch([text], add_special_tokens=False)[0].ids)
  return list(tokenizer(text, add_special_tokens=False)["input_ids"])
