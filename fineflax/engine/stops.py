"""Stop strings on the host: where a row's current model segment must be cut."""
from __future__ import annotations

from typing import Callable, Sequence


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
