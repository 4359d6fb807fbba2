"""Incremental detokenisation: the streamed deltas of random token streams (multi-byte characters split over
byte-level tokens, special tokens, invalid byte runs) concatenate to the text of all the tokens, with the real
SmolLM2 tokenizer; no delta ends in an incomplete character."""
import numpy as np
import pytest

from fineflax.engine.detok import REPLACEMENT, StreamText, text_decoder, token_bytes

pytestmark = pytest.mark.fast

TEXTS = ["naïve café — 東京タワー 🤖🎨 paints: ∑ x² ≠ y³; Ελληνικά, русский, עברית 👩‍👩‍👧",
         "plain ascii words and  spaces\n\tnew lines", "😀😃😄😁 中文字符测试 한국어"]


@pytest.fixture(scope="module")
def tok():
  from fineflax.models import load_tokenizer
  return load_tokenizer("smollm2-135m-instruct")


def _stream(decode, ids, rng):
  stream, deltas, i = StreamText(decode), [], 0
  while i < len(ids):
    k = int(rng.integers(1, 9))  # one engine chunk: 1 .. 8 tokens
    deltas.append(stream.add(ids[i:i + k]))
    i += k
  return deltas, stream.flush()


def test_streamed_deltas_concatenate_to_the_decoded_text(tok):
  rng = np.random.default_rng(0)
  decode = text_decoder(tok)  # the Rust backend's decode: checked against tok.decode below
  byte_tokens = [tok.convert_tokens_to_ids(c) for c in tok.get_vocab() if len(c) == 1]
  specials = list(tok.all_special_ids)
  cases = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
  for _ in range(150):  # random ids: any vocabulary entry, single bytes (broken UTF-8), special tokens
    n = int(rng.integers(1, 60))
    pool = [rng.integers(0, len(tok)), rng.choice(byte_tokens), rng.choice(specials)]
    cases.append([int(pool[j]) for j in rng.choice(3, size=n, p=[0.5, 0.4, 0.1])])
  held = 0
  for ids in cases:
    deltas, rest = _stream(decode, ids, rng)
    assert "".join(deltas) + rest == decode(ids) == tok.decode(ids, skip_special_tokens=True), ids
    assert not any(d.endswith(REPLACEMENT) for d in deltas), (ids, deltas)
    held += bool(rest)
  assert held > 0  # some random streams end inside a character: flush gives it (as U+FFFD)


def test_a_character_split_over_tokens_waits_for_its_last_byte(tok):
  ids = tok.encode("🤖", add_special_tokens=False)
  assert len(ids) > 1  # byte-level BPE: the emoji's 4 bytes take several tokens
  stream = StreamText(lambda x: tok.decode(x, skip_special_tokens=True))
  assert [stream.add([t]) for t in ids[:-1]] == [""] * (len(ids) - 1)
  assert stream.add(ids[-1:]) == "🤖" and stream.flush() == ""
  # a chunk ending inside a character emits the complete text before it
  more = tok.encode(" ok 🎨", add_special_tokens=False)
  assert stream.add(more[:-1]) == " ok" and stream.add(more[-1:]) == " 🎨"


def test_a_window_decoder_that_drops_leading_spaces_keeps_them_inside_the_stream():
  """SentencePiece-like: decode strips the text's leading space; each delta still carries its own."""
  words = {1: "▁the", 2: "▁robot", 3: "s", 4: "▁paint", 5: "ed"}
  decode = lambda ids: "".join(words[i] for i in ids).replace("▁", " ").lstrip(" ")
  rng = np.random.default_rng(1)
  for _ in range(50):
    ids = [int(t) for t in rng.integers(1, 6, size=int(rng.integers(1, 20)))]
    deltas, rest = _stream(decode, ids, rng)
    assert "".join(deltas) + rest == decode(ids)


def test_token_bytes_join_to_the_texts_utf8_even_inside_a_character(tok):
  of = token_bytes(tok)
  for text in TEXTS:
    ids = tok.encode(text, add_special_tokens=False)
    assert b"".join(of(t) for t in ids) == text.encode("utf-8"), text
  ids = tok.encode("😀", add_special_tokens=False)
  assert len(ids) == 3 and [len(of(t)) for t in ids] == [2, 1, 1]  # the probe's 10813, 242, 218
  assert all(tok.decode([t]) == REPLACEMENT for t in ids)  # what decoding one such token alone gives
  assert of(tok.all_special_ids[0]) == tok.decode([tok.all_special_ids[0]]).encode()


def test_token_bytes_of_a_sentencepiece_byte_fallback_vocabulary():
  class Piece:  # a Llama-2-like vocabulary: "▁" for spaces, <0xNN> for bytes outside it
    all_special_ids = [0]
    backend_tokenizer = type("B", (), {"decoder": "Sequence([Replace('▁', ' '), ByteFallback(), Fuse()])"})()
    vocab = {0: "</s>", 1: "▁caf", 2: "é", 3: "<0xF0>", 4: "<0x9F>", 5: "<0x98>", 6: "<0x80>"}

    def convert_ids_to_tokens(self, i):
      return self.vocab[i]

    def decode(self, ids, skip_special_tokens=False):
      return "".join(self.vocab[i] for i in ids)
  of = token_bytes(Piece())
  assert b"".join(of(t) for t in [1, 2, 3, 4, 5, 6]) == " café😀".encode()
  assert of(0) == b"</s>"
