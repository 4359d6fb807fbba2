"""Task-type dispatch: coding -> `code`, function calling -> `function_call`, else `chat`.

detect_task: "code" if the example has `tests`; else "function_call" if it has `tools`/`functions`;
else "code" if the prompt asks for code (CODE_PROMPT); else "chat". Tools are checked before the prompt
keywords because tool-use prompts often say "function".
"""
from __future__ import annotations

import re

from fineflax.rewards import chat, code_reward, function_call  # noqa: F401  (registers the three)
from fineflax.rewards.registry import get_reward, register

CODE_PROMPT = re.compile(
    r"```|\b(?:python|javascript|java|c\+\+|rust|sql)\b|"
    r"\b(?:write|implement|complete|fix|debug|refactor)\b[^.?!\n]{0,60}\b(?:code|function|program|script|class|method)\b",
    re.IGNORECASE)


def detect_task(prompt: str, example: dict) -> str:
  if example.get("tests"):
    return "code"
  if example.get("tools") or example.get("functions"):
    return "function_call"
  return "code" if CODE_PROMPT.search(prompt) else "chat"


@register("combined")
def combined_reward(prompt: str, completion: str, **example) -> float:
  return get_reward(detect_task(prompt, example))(prompt, completion, **example)
