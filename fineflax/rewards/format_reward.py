"""Format reward: exactly one `<think>...</think>` followed by exactly one `<answer>...</answer>`.

1.0 iff the completion matches ^\\s*<think>X</think>\\s*<answer>Y</answer>\\s*$ (DOTALL) where X and Y hold
no think/answer tag; otherwise (unclosed, repeated, nested, text outside) 0.0.
"""
from __future__ import annotations

import re

from fineflax.rewards.registry import register

_NO_TAG = r"(?:(?!</?(?:think|answer)>).)*"
_FORMAT = re.compile(rf"\s*<think>{_NO_TAG}</think>\s*<answer>{_NO_TAG}</answer>\s*", re.DOTALL)


@register("format")
def format_reward(prompt: str, completion: str, **example) -> float:
  del prompt, example
  return float(_FORMAT.fullmatch(completion) is not None)
