"""Code reward: extract Python, check syntax, run unit tests in the sandbox (never in this process).

Code: the last ```python / ```py fenced block, else the last plain ``` block, else the whole text.
Tests (`example["tests"]`): a list of assert statements, or one test source whose top-level `assert`
statements are the tests (its other statements run first as setup; with no top-level assert and an
`entry_point`, HumanEval style: `check(<entry_point>)` is the single test; otherwise the whole source is one
test). The harness (`code_harness.py`, run as the sandbox's main.py) runs the solution (as module
`solution`, so `if __name__ == "__main__"` blocks do not run) in a process of its own and the setup and
tests in another, which receives only plain values (numbers, strings, containers of them) from it, so
comparisons happen outside the solution's process; the nonce and the tests reach the harness over stdin
after the solution's process was forked, and only the harness can print `<nonce> <i> <0|1>` lines.
The setup does not run in the solution's process (a solution using a name only the tests import fails).
If the sandbox cannot start, the reward raises `SandboxUnavailableError` (scoring stops; see sandbox.py).

Score:
- with tests: fraction of tests that passed (0 on syntax error, crash at import, timeout before any result);
- without tests (partial credit): 0 if no code or a syntax error; FENCE_CREDIT for a syntax error inside
  a proper fence; SYNTAX_CREDIT for valid code outside a fence; 1.0 for valid code in a ```python fence.
"""
from __future__ import annotations

import ast
import json
import pathlib
import re
import secrets

from fineflax.rewards.registry import register
from fineflax.rewards.sandbox import run_python

FENCE_CREDIT = 0.2
SYNTAX_CREDIT = 0.8
TIMEOUT_S = 5.0
MEMORY_MB = 512
_PY_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_ANY_FENCE = re.compile(r"```[ \t]*\n(.*?)```", re.DOTALL)
_HARNESS = (pathlib.Path(__file__).parent / "code_harness.py").read_text(encoding="utf-8")


def extract_code(text: str) -> tuple[str, bool]:
  """(code, came_from_python_fence)."""
  blocks = _PY_FENCE.findall(text)
  if blocks:
    return blocks[-1], True
  blocks = _ANY_FENCE.findall(text)
  if blocks:
    return blocks[-1], False
  return text, False


def split_tests(tests, entry_point: str | None = None) -> tuple[list[str], list[str]]:
  """(setup statements, test statements) from a list of asserts or one test source (see docstring)."""
  if isinstance(tests, str):
    try:
      tree = ast.parse(tests)
    except SyntaxError as e:
      raise ValueError(f"example['tests'] is not valid Python (line {e.lineno}): {e.msg}") from None
    asserts = [ast.get_source_segment(tests, n) for n in tree.body if isinstance(n, ast.Assert)]
    setup = [ast.get_source_segment(tests, n) for n in tree.body if not isinstance(n, ast.Assert)]
    if asserts:
      return setup, asserts
    if entry_point and any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
      return [tests], [f"check({entry_point})"]
    return [], [tests]
  if isinstance(tests, (list, tuple)) and all(isinstance(t, str) for t in tests):
    return [], list(tests)
  raise ValueError(f"example['tests'] must be a str or a list of str, got {type(tests).__name__}")


def run_tests(code: str, tests: list[str], setup: list[str] = (), timeout_s: float = TIMEOUT_S,
              memory_mb: int = MEMORY_MB) -> tuple[int, int]:
  """(passed, total) for `tests` against `code`, run in the sandbox."""
  nonce = secrets.token_hex(16)
  spec = json.dumps({"setup": list(setup), "tests": list(tests)})
  result = run_python(_HARNESS, timeout_s, memory_mb, stdin=nonce + "\n" + spec, files={"solution.py": code})
  passed = set()
  for line in result.stdout.splitlines():
    parts = line.split()
    if len(parts) == 3 and parts[0] == nonce and parts[2] == "1" and parts[1].isdigit():
      passed.add(int(parts[1]))
  return len(passed & set(range(len(tests)))), len(tests)


@register("code")
def code_reward(prompt: str, completion: str, **example) -> float:
  del prompt
  code, fenced = extract_code(completion)
  if not code.strip():
    return 0.0
  try:
    ast.parse(code)
    valid = True
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    valid = False
  tests = example.get("tests")
  if tests:
    setup, cases = split_tests(tests, example.get("entry_point"))
    if not valid or not cases:
      return 0.0
    passed, total = run_tests(code, cases, setup, float(example.get("timeout_s", TIMEOUT_S)))
    return passed / total
  if not valid:
    return FENCE_CREDIT if fenced else 0.0
  return 1.0 if fenced else SYNTAX_CREDIT
