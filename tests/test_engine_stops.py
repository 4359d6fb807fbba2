"""Incremental stop strings (`engine.stops.StopScan`): the same cut as `stop_cut` over the whole segment, chunk
by chunk, on random SmolLM2 token streams (stop strings split over tokens and over chunks, characters split over
byte-level tokens, special tokens, a segment after appended tokens), and work per chunk that does not grow
with the answer's length."""
import numpy as np
import pytest

from fineflax.engine.detok import text_decoder
from fineflax.engine.stops import StopScan, stop_cut

pytestmark = pytest.mark.fast

TEXTS = ["The answer is <answer>42</answer> and then more text follows here.",
         "robots 🤖 paint 🎨 with brushes; 東京タワー is tall. STOP here, not there.",
         "naïve café — ∑ x² ≠ y³ 😀😃 end of the story\n\nUser: next question"]


@pytest.fixture(scope="module")
def tok():
  from fineflax.models import load_tokenizer
  return load_tokenizer("smollm2-135m-instruct")


def _chunks(n, rng):
  """Chunk ends of a stream of n tokens: 1 .. 8 tokens a chunk (an engine's decode chunks)."""
  ends, i = [], 0
  while i < n:
    i = min(n, i + int(rng.integers(1, 9)))
    ends.append(i)
  return ends


def _old_and_new(decode, prefix, ids, stops, rng):
  """(stop_cut's answer at the first chunk where it finds a stop string, StopScan's at that chunk; both None
  when none is found) for the segment `ids` after `prefix` tokens (appended tool text the search skips)."""
  scan, tokens = StopScan(stops, decode, start=len(prefix)), list(prefix)
  for end in _chunks(len(ids), rng):
    tokens[len(prefix):] = ids[:end]
    old, new = stop_cut(tokens[len(prefix):], stops, decode), scan.scan(tokens)
    if old is not None or new is not None:
      return old, new
  return None, None


def test_incremental_stops_cut_where_the_whole_segment_search_cuts(tok):
  rng = np.random.default_rng(0)
  decode = text_decoder(tok)
  byte_tokens = [tok.convert_tokens_to_ids(c) for c in tok.get_vocab() if len(c) == 1]
  specials = list(tok.all_special_ids)
  cases = []
  for text in TEXTS:
    ids = tok.encode(text, add_special_tokens=False)
    for stops in (["</answer>"], ["🎨"], ["STOP", "tall"], ["\n\nUser:"], ["x² ≠"], ["never there"],
                  ["🤖 paint", "42<"], ["e"]):
      cases.append((ids, stops))
  for _ in range(120):  # random ids; stop strings drawn from their text (split over tokens and chunks)
    n = int(rng.integers(2, 60))
    pool = [rng.integers(0, len(tok)), rng.choice(byte_tokens), rng.choice(specials)]
    ids = [int(pool[j]) for j in rng.choice(3, size=n, p=[0.6, 0.3, 0.1])]
    text = decode(ids).replace("\ufffd", "")
    if len(text) < 2:
      continue
    stops = []
    for _ in range(int(rng.integers(1, 4))):
      a = int(rng.integers(0, len(text) - 1))
      stops.append(text[a:a + int(rng.integers(1, 7))])
    cases.append((ids, stops))
  found = split = 0
  for ids, stops in cases:
    prefix = [int(t) for t in rng.integers(0, len(tok), size=int(rng.integers(0, 4)))]
    old, new = _old_and_new(decode, prefix, ids, stops, rng)
    assert new == old, (ids, stops, old, new)
    if old is not None:
      found += 1
      split += any(s in decode(ids[:old[0]]) and s not in decode(ids[old[0] - 1:old[0]]) for s in stops)
  assert found > 100 and split > 20  # most cases stop, many on a string spread over several tokens


def test_a_stop_string_split_over_a_characters_bytes_is_found_on_its_last_token(tok):
  decode = text_decoder(tok)
  ids = tok.encode("paint 🎨 now", add_special_tokens=False)
  scan = StopScan(["🎨"], decode)
  emoji = next(k for k in range(1, len(ids) + 1) if "🎨" in decode(ids[:k]))
  assert emoji >= 2 and "\ufffd" in decode(ids[:emoji - 1])  # the character's bytes span tokens
  got = [scan.scan(ids[:k]) for k in range(1, emoji + 1)]
  assert got[:-1] == [None] * (emoji - 1) and got[-1] == stop_cut(ids[:emoji], ["🎨"], decode)


def test_work_per_chunk_does_not_grow_with_the_answers_length(tok):
  decoded = []  # tokens decoded by each decode call

  def decode(ids):
    decoded.append(len(ids))
    return tok.decode(ids, skip_special_tokens=True)

  ids = tok.encode(" ".join(["a robot learns to paint the sea"] * 200), add_special_tokens=False)
  assert len(ids) > 1000
  scan, per_chunk = StopScan(["never there"], decode), []
  for end in range(8, len(ids), 8):
    decoded.clear()
    assert scan.scan(ids[:end]) is None
    per_chunk.append(sum(decoded))
  first, last = per_chunk[:20], per_chunk[-20:]
  assert max(last) <= max(first) <= 3 * 8 + 8  # a few windows of the chunk's tokens, at any length
  decoded.clear()
  stop_cut(ids[:len(ids) // 8 * 8], ["never there"], decode)  # the old search: the whole segment a chunk
  assert sum(decoded) >= len(ids) - 8 > 30 * max(last)
