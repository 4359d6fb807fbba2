"""Reward functions for RL: `fn(prompt, completion, **example) -> float`, a registry and batch scoring.

Registered names: math, math_think, math_last_number (graded with math-verify, as LUFFY's reward), format,
code, function_call, chat, combined, exact_match, exact_match_lenient; Search-R1's search_r1_em / search_r1_format / search_r1_searched (fineflax.search_r1.rewards,
imported on first use: `registry.PROVIDERS`).
"""
from fineflax.rewards.registry import REWARDS, get_reward, register, reward_names, score_completions
from fineflax.rewards import chat, code_reward, combined, format_reward, function_call, math_reward, qa  # noqa: F401
from fineflax.rewards.qa import extract_answer, normalize_answer
from fineflax.rewards.math_reward import extract_math_answer, math_equal, math_verify_correct
from fineflax.rewards.errors import RewardSetupError
from fineflax.rewards.sandbox import SandboxResult, SandboxUnavailableError, run_python

__all__ = ["REWARDS", "get_reward", "register", "reward_names", "score_completions", "extract_answer", "normalize_answer",
           "math_equal", "math_verify_correct", "extract_math_answer", "SandboxResult", "run_python",
           "RewardSetupError", "SandboxUnavailableError"]
