"""One example -> its training sequence, or the reason it is dropped; per-source drop accounting.

`prepare(tokenizer, messages, max_length, truncation)` renders and tokenizes the conversation
(`tokenize_chat`), cuts it to max_length + 1 ids (`truncate`) and shifts it (`shift`: max_length
positions). It is dropped as

  dropped_too_long  longer than max_length + 1 ids with truncation="drop";
  dropped_no_loss   no assistant target left after truncation (with "right": the prompt, i.e. the ids
                    before the first assistant token, is >= max_length + 1 long).

`new_source_stats(name)` / `account(stats, prepared)` count, per source: drawn, examples, truncated,
tokens (positions the kept examples fill) and trained tokens (their loss targets), the drops by reason,
and the shortest dropped example / prompt (to say what max_length would keep it);
`drop_summary(stats, max_length, truncation)` says it in one line.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fineflax.data.chat import tokenize_chat
from fineflax.data.packing import shift, truncate

DROP_REASONS = ("dropped_too_long", "dropped_no_loss")


class Prepared(NamedTuple):
  seq: tuple | None  # (tokens, targets, loss) or None when dropped
  reason: str | None  # one of DROP_REASONS when dropped
  num_ids: int  # ids of the whole rendered conversation
  prompt: int  # ids before the first assistant token (num_ids when there is none)
  truncated: bool


def prepare(tokenizer, messages, max_length: int, truncation: str) -> Prepared:
  """The (tokens, targets, loss) sequence of one conversation, or why it is dropped (module docstring)."""
  ids, assistant = tokenize_chat(tokenizer, messages)
  prompt = int(np.argmax(assistant)) if assistant.any() else len(ids)
  kept = truncate(ids, assistant, max_length + 1, truncation)
  if kept is None:
    return Prepared(None, "dropped_too_long", len(ids), prompt, False)
  seq = shift(*kept)
  if not seq[2].any():
    return Prepared(None, "dropped_no_loss", len(ids), prompt, len(kept[0]) < len(ids))
  return Prepared(seq, None, len(ids), prompt, len(kept[0]) < len(ids))


def new_source_stats(name: str) -> dict:
  return {"name": name, "drawn": 0, "examples": 0, "truncated": 0, "tokens": 0, "trained_tokens": 0,
          "dropped_too_long": 0, "dropped_no_loss": 0, "shortest_too_long": None,
          "shortest_prompt_no_loss": None}


def account(stats: dict, p: Prepared) -> None:
  """Adds one prepared example to a source's stats (in place)."""
  stats["drawn"] += 1
  if p.reason is None:
    stats["examples"] += 1
    stats["truncated"] += int(p.truncated)
    stats["tokens"] += len(p.seq[0])
    stats["trained_tokens"] += int(p.seq[2].sum())
    return
  stats[p.reason] += 1
  key, value = (("shortest_too_long", p.num_ids) if p.reason == "dropped_too_long"
                else ("shortest_prompt_no_loss", p.prompt))
  stats[key] = value if stats[key] is None else min(stats[key], value)


def dropped(stats: dict) -> int:
  return sum(stats[r] for r in DROP_REASONS)


def reason_text(stats: dict, reason: str, max_length: int, truncation: str) -> str:
  if reason == "dropped_too_long":
    return (f"longer than max_length + 1 = {max_length + 1} ids with truncation='drop'; the shortest is "
            f"{stats['shortest_too_long']} ids")
  if truncation == "left":
    return f"no assistant token within the last max_length={max_length} tokens (truncation='left')"
  return (f"no assistant token within max_length={max_length}; the shortest prompt is "
          f"{stats['shortest_prompt_no_loss']} tokens")


def drop_summary(stats: dict, max_length: int, truncation: str) -> str:
  """"40 with no assistant token within max_length=64; the shortest prompt is 70 tokens; 5 longer ..."."""
  parts = [(stats[r], reason_text(stats, r, max_length, truncation)) for r in DROP_REASONS if stats[r]]
  if len(parts) == 1:
    return parts[0][1]
  return "; ".join(f"{n} {'with ' if text.startswith('no ') else ''}{text}" for n, text in parts)
