"""Search-R1 text protocol: the prompt, action parsing, inserted passages and the corrective message.

A model turn ends at the first `</search>` or `</answer>`. Its action is the last complete
`<search>q</search>` / `<answer>a</answer>` in the turn's text (no nested opening tag inside); anything
else (no tag, an empty query) is invalid. After a search the environment inserts

  "\\n\\n<information>Doc 1(Title: t1) text1\\nDoc 2(Title: t2) text2\\n</information>\\n\\n"

(Search-R1 `_passages2string` + `execute_predictions`; the information tag is configurable: the classic
variant uses <context>), and after an invalid action `Tags.invalid_text`.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

# Search-R1 scripts/data_process/nq_search.py (instruct models: the whole prompt is the user message).
SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between "
    "<{info}> and </{info}>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without "
    "detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n")

INVALID_ACTION_TEXT = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and "
    "</answer>. Let me try again.\n")


@dataclasses.dataclass(frozen=True)
class Passage:
  """One retrieved passage as the model sees it: `Doc i(Title: title) text`."""
  title: str
  text: str


@dataclasses.dataclass(frozen=True)
class Tags:
  """Tag names of the protocol (Search-R1 defaults; `info="context"` for the classic variant)."""
  search: str = "search"
  answer: str = "answer"
  info: str = "information"
  think: str = "think"
  invalid_text: str = INVALID_ACTION_TEXT

  @property
  def stop_strings(self) -> tuple[str, str]:
    return (f"</{self.search}>", f"</{self.answer}>")


def build_prompt(question: str, tags: Tags = Tags(), template: str = SEARCH_R1_PROMPT) -> str:
  """The user message: `template` with {question} and {info} filled in."""
  return template.format(question=question.strip(), info=tags.info)


def cut_at_stop(text: str, stop_strings: Sequence[str]) -> tuple[str, bool]:
  """(text up to the end of its earliest stop string, whether one was found)."""
  ends = [text.find(s) + len(s) for s in stop_strings if s and s in text]
  return (text[:min(ends)], True) if ends else (text, False)


def parse_action(turn_text: str, tags: Tags = Tags()) -> tuple[str, str]:
  """("search" | "answer", stripped content) of the last complete action tag, or ("invalid", "").

  An empty search query is invalid (there is nothing to send to the engine); an empty answer is an answer.
  """
  s, a = re.escape(tags.search), re.escape(tags.answer)
  pattern = rf"<({s}|{a})>((?:(?!<(?:{s}|{a})>).)*?)</\1>"
  matches = list(re.finditer(pattern, turn_text, re.DOTALL))
  if not matches:
    return "invalid", ""
  kind = "search" if matches[-1].group(1) == tags.search else "answer"
  content = matches[-1].group(2).strip()
  if kind == "search" and not content:
    return "invalid", ""
  return kind, content


def format_passages(passages: Sequence[Passage]) -> str:
  """Search-R1 `_passages2string`: "Doc {i}(Title: {title}) {text}\\n" for i = 1, 2, ..."""
  return "".join(f"Doc {i}(Title: {p.title}) {p.text}\n" for i, p in enumerate(passages, 1))


def information_text(body: str, tags: Tags = Tags()) -> str:
  """The inserted block after a search: "\\n\\n<info>{body.strip()}</info>\\n\\n"."""
  return f"\n\n<{tags.info}>{body.strip()}</{tags.info}>\n\n"


def turn_is_well_formed(turn_text: str, tags: Tags = Tags()) -> bool:
  """True iff the turn is exactly `<think>X</think>` then one `<search>q</search>` or `<answer>a</answer>`
  (whitespace around; X, q, a hold no protocol tag; q non-empty)."""
  names = "|".join(re.escape(t) for t in (tags.think, tags.search, tags.answer, tags.info))
  no_tag = rf"(?:(?!</?(?:{names})>).)*"
  think, s, a = (re.escape(t) for t in (tags.think, tags.search, tags.answer))
  pattern = rf"\s*<{think}>{no_tag}</{think}>\s*(?:<{s}>{no_tag}\S{no_tag}</{s}>|<{a}>{no_tag}</{a}>)\s*"
  return re.fullmatch(pattern, turn_text, re.DOTALL) is not None
