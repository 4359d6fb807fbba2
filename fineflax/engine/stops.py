"""Stop strings on the host: where a row's current model segment must be cut.

    cut = stop_cut(segment, stops, decode)          # decodes the whole segment (and prefixes of it)
    scan = StopScan(stops, decode, start=seg_start)  # incremental: each call decodes the new tokens only
    cut = scan.scan(tokens)                         # after each chunk; same (n, excess_chars) as stop_cut

`StopScan` keeps the segment's text (`engine.detok.StreamText`: a window of a few tokens decoded a call) and
looks for a stop string only where one can end in the new text, i.e. from len(old text) - len(stop) + 1:
a stop string split over tokens, or over chunks, is found when its last character arrives, and no text
before that is decoded again. Cost per call: two or three decodes of the new tokens plus a window, and a
search over the new characters plus len(longest stop) - 1; when a stop string ends inside the chunk, the
chunk is decoded once more token by token to find the first token after which it is there.
"""
from __future__ import annotations

from typing import Callable, Sequence

from fineflax.engine.detok import StreamText


def stop_cut(segment: Sequence[int], stop_strings: Sequence[str], decode: Callable) -> tuple[int, int] | None:
  """(n, excess_chars) for the shortest prefix segment[:n] whose text decode(segment[:n]) holds a stop
  string, excess_chars = characters of that text past the earliest stop string's end; None when the
  whole segment's text holds none. decode: token ids -> text (skip_special_tokens=True)."""
  if not any(s in decode(segment) for s in stop_strings):
    return None
  lo, hi = 1, len(segment)  # smallest n with a stop string in decode(segment[:n])
  while lo < hi:
    mid = (lo + hi) // 2
    if any(s in decode(segment[:mid]) for s in stop_strings):
      hi = mid
    else:
      lo = mid + 1
  text = decode(segment[:lo])
  cut = min(text.find(s) + len(s) for s in stop_strings if s in text)
  return lo, len(text) - cut


def first_stop_end(text: str, stop_strings: Sequence[str], old: int) -> int | None:
  """The earliest end (index after its last character) of a stop string in `text` among the occurrences
  that end past text[:old] (which holds none); None if there is none."""
  ends = [i + len(s) for s in stop_strings if (i := text.find(s, max(0, old - len(s) + 1))) >= 0]
  return min(ends) if ends else None


class StopScan:
  """Incremental `stop_cut` of the segment tokens[start:] of a growing token list (module docstring).
  `key` = (start, stop strings): a sequence whose segment or stop strings change needs a new scan."""

  def __init__(self, stop_strings: Sequence[str], decode: Callable, start: int = 0):
    self.stop_strings = tuple(s for s in stop_strings if s)
    self.key = (int(start), self.stop_strings)
    self.stream = StreamText(decode)
    self.start, self.fed, self.text = int(start), 0, ""  # fed: segment tokens given to `stream`

  def scan(self, tokens: Sequence[int]) -> tuple[int, int] | None:
    """stop_cut(tokens[start:], ...) given that the previous call (on a prefix of the same tokens) found
    none: (n, excess_chars) with n counted from `start`, or None."""
    new = tokens[self.start + self.fed:]
    if not new or not self.stop_strings:
      return None
    mark, old = self.stream.mark(), len(self.text)
    text = self.text + self.stream.add(new)
    end = first_stop_end(text, self.stop_strings, old)
    if end is None:
      self.text, self.fed = text, self.fed + len(new)
      return None
    self.stream.rewind(mark)  # a stop string ends in this chunk: the first token after which it is there
    text = self.text
    for k, t in enumerate(new):
      text += self.stream.add([t])
      if len(text) >= end:
        self.text, self.fed = text, self.fed + k + 1
        return self.fed, len(text) + len(self.stream.peek()) - end
    raise AssertionError("unreachable: the chunk's text holds the stop string")
