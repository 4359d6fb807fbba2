"""Pairwise LLM judge, asked in both orders to cancel position bias.

For each example the judge sees the conversation and two answers twice: (A as Response 1, B as Response 2),
then (B as 1, A as 2). It must end with [[1]], [[2]] or [[tie]] (the last such tag counts; none = invalid,
counted as a tie). Each verdict becomes a vote for A: +1 (prefers A), -1 (prefers B), 0 (tie/invalid).
Outcome = sign(vote_order1 + vote_order2): A wins when the two orders net favour it (A+A, A+tie), loses
symmetrically, and it is a tie otherwise -- including A in one order and B in the other, which is the
signature of position bias. A judge that always picks Response 1 therefore yields only ties.

A judge is any callable `messages -> text`; `openai_judge(url, model)` asks an OpenAI-compatible endpoint.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

Judge = Callable[[list[dict]], str]

SYSTEM = ("You are an impartial judge. Compare two responses to the conversation below. Judge correctness "
          "first, then helpfulness and clarity; ignore length and the order of the responses. Explain briefly, "
          "then end with your verdict on its own line: [[1]] if Response 1 is better, [[2]] if Response 2 "
          "is better, [[tie]] if they are equally good.")
_VERDICT = re.compile(r"\[\[\s*(1|2|tie)\s*\]\]", re.IGNORECASE)


def render_conversation(messages: Sequence[dict]) -> str:
  return "\n".join(f"{m['role'].upper()}: {m.get('content') or ''}" for m in messages)


def judge_messages(prompt: Sequence[dict], first: str, second: str, reference: str | None = None) -> list[dict]:
  ref = f"\n\n[Reference answer]\n{reference}" if reference else ""
  user = (f"[Conversation]\n{render_conversation(prompt)}{ref}\n\n[Response 1]\n{first}\n[End of Response 1]"
          f"\n\n[Response 2]\n{second}\n[End of Response 2]")
  return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def parse_verdict(text: str) -> str:
  """'1', '2', 'tie' from the last [[...]] tag, or 'invalid'."""
  found = _VERDICT.findall(text or "")
  return found[-1].lower() if found else "invalid"


def vote_for_a(verdict: str, a_first: bool) -> int:
  if verdict not in ("1", "2"):
    return 0
  a_won = (verdict == "1") == a_first
  return 1 if a_won else -1


def combine(vote1: int, vote2: int) -> int:
  s = vote1 + vote2
  return (s > 0) - (s < 0)


def judge_pair(judge: Judge, prompt, answer_a: str, answer_b: str, reference: str | None = None) -> dict:
  """{"outcome" (+1 A, 0, -1 B), "verdicts" [order AB, order BA], "votes"}."""
  v_ab = parse_verdict(judge(judge_messages(prompt, answer_a, answer_b, reference)))
  v_ba = parse_verdict(judge(judge_messages(prompt, answer_b, answer_a, reference)))
  votes = [vote_for_a(v_ab, True), vote_for_a(v_ba, False)]
  return {"outcome": combine(*votes), "verdicts": [v_ab, v_ba], "votes": votes}


def openai_judge(base_url: str, model: str, api_key: str | None = None, max_tokens: int = 512,
                 timeout: float = 120.0) -> Judge:
  """A judge backed by an OpenAI-compatible chat endpoint (greedy)."""
  import openai
  client = openai.OpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout, max_retries=2)

  def ask(messages: list[dict]) -> str:
    r = client.chat.completions.create(model=model, messages=messages, temperature=0.0, max_tokens=max_tokens)
    return r.choices[0].message.content or ""
  return ask
