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


def _byte_level_chars() -> dict[str, int]:
  """GPT-2's bytes_to_unicode, inverted: the printable character byte-level BPE writes for a byte -> the byte
  (printable Latin-1 bytes stand for themselves, the other 68 for chr(256 + k) in byte order)."""
  kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
  others = [b for b in range(256) if b not in kept]
  return {**{chr(b): b for b in kept}, **{chr(256 + k): b for k, b in enumerate(others)}}


def token_bytes(tokenizer) -> Callable[[int], bytes]:
  """token id -> the token's own bytes, so that joining a text's tokens' bytes gives its UTF-8 (a character
  split over tokens has its bytes split the same way; decoding one such token alone gives U+FFFD instead).
  Byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM2): each character of the vocabulary entry maps back to one
  byte; SentencePiece byte fallback: `<0xNN>` is byte NN and "▁" a space; special tokens (and any other
  vocabulary): the UTF-8 of their decoded text."""
  decoder = repr(getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None))
  byte_level, fallback = "ByteLevel" in decoder, "ByteFallback" in decoder
  chars, special = _byte_level_chars(), set(getattr(tokenizer, "all_special_ids", ()))
  cache: dict[int, bytes] = {}

  def of(token: int) -> bytes:
    token = int(token)
    if token in cache:
      return cache[token]
    piece = tokenizer.convert_ids_to_tokens(token) if token not in special else None
    if byte_level and piece is not None and all(c in chars for c in piece):
      out = bytes(chars[c] for c in piece)
    elif fallback and piece is not None and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
      out = bytes([int(piece[3:5], 16)])
    elif fallback and piece is not None:
      out = piece.replace("▁", " ").encode("utf-8")
    else:
      out = tokenizer.decode([token], skip_special_tokens=False).encode("utf-8")
    cache[token] = out
    return out
  return of
