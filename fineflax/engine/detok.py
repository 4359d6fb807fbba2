"""Incremental detokenisation of a growing token stream: each update decodes a small window, not every token.

    stream = StreamText(lambda ids: tok.decode(ids, skip_special_tokens=True))
    delta = stream.add(new_ids)   # text that is final now ("" while a character is incomplete)
    rest = stream.flush()         # at the end: whatever was held back (may hold U+FFFD)
    # "".join(all deltas) + rest == decode(all ids)

The offsets trick of TGI's `decode_token` / vLLM's `detokenize_incrementally`: `prefix` .. `read` are
the last tokens whose text was already emitted; with new ids,
  prefix_text = decode(ids[prefix:read]),  new_text = decode(ids[prefix:]),
  delta = new_text[len(prefix_text):]
so a token's text is always decoded with some tokens before it (SentencePiece drops the leading space of
a window's first token; byte-level BPE splits a character's bytes over tokens). A window whose text ends in
U+FFFD (an incomplete UTF-8 character) is emitted only up to the last token after which it does not; the
rest waits for the next ids (or `flush`). Cost per update: two or three decodes of a few tokens.
"""
from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"


class StreamText:
  """One stream's detokeniser state (module docstring). decode: ids -> text."""

  def __init__(self, decode: Callable[[Sequence[int]], str]):
    self.decode = decode
    self.ids: list[int] = []
    self.prefix = 0  # start of the context window
    self.read = 0  # ids before this one have their text emitted

  def add(self, ids: Sequence[int]) -> str:
    """Appends `ids`; returns the text that became final."""
    self.ids.extend(int(t) for t in ids)
    prefix_text = self.decode(self.ids[self.prefix:self.read])
    end = len(self.ids)
    while end > self.read:
      text = self.decode(self.ids[self.prefix:end])
      if len(text) > len(prefix_text) and not text.endswith(REPLACEMENT):
        self.prefix, self.read = self.read, end
        return text[len(prefix_text):]
      if not text.endswith(REPLACEMENT):  # nothing new (special tokens): nothing held back either
        return ""
      end -= 1  # the last token leaves a character incomplete: try without it
    return ""

  def peek(self) -> str:
    """The text held back (an incomplete character at the end decodes to U+FFFD), left held back."""
    if self.read == len(self.ids):
      return ""
    return self.decode(self.ids[self.prefix:])[len(self.decode(self.ids[self.prefix:self.read])):]

  def flush(self) -> str:
    """`peek`; the stream is then fully emitted."""
    text = self.peek()
    self.prefix = self.read = len(self.ids)
    return text

  def mark(self) -> tuple[int, int, int]:
    """The state to `rewind` to: (ids, prefix, read)."""
    return len(self.ids), self.prefix, self.read

  def rewind(self, mark: tuple[int, int, int]) -> None:
    """Back to the state of `mark()`: the ids added since are dropped."""
    n, self.prefix, self.read = mark
    del self.ids[n:]


def text_decoder(tokenizer) -> Callable[[Sequence[int]], str]:
  """ids -> tokenizer.decode(ids, skip_special_tokens=True): the fast tokenizer's Rust backend directly when
  the Python wrapper adds nothing to it (no clean-up of tokenization spaces), which halves the cost of the
  few-token decodes of `StreamText`; the wrapper otherwise."""
  backend = getattr(tokenizer, "_tokenizer", None)
  if callable(getattr(backend, "decode", None)) and getattr(tokenizer, "clean_up_tokenization_spaces", None) is False:
    return lambda ids: backend.decode(list(ids), skip_special_tokens=True)
  return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
