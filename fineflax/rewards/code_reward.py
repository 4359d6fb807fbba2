"""Code reward: extract Python, check syntax, run unit tests in the sandbox (never in this process).

Code: the last ```python / ```py fenced block, else the last plain ``` block, else the whole text.
Tests (`example["tests"]`): a list of assert statements, or one test source whose top-level `assert`
statements are the tests (its other statements run first as setup; with no top-level assert and an
`entry_point`, HumanEval style: `check(<entry_point>)` is the single test; otherwise the whole source is one
test). A harness child runs the solution (as module `solution`, so `if __name__ == "__main__"` blocks do not
run), then each test, printing `<nonce> <i> <0|1>`; the nonce comes over stdin so printed text cannot be
mistaken for a result (a program that inspects the harness's frames could still forge it).
If the sandbox cannot start, the reward raises `SandboxUnavailableError` (scoring stops; see sandbox.py).

Score:
- with tests: fraction of tests that passed (0 on syntax error, crash at import, timeout before any result);
- without tests (partial credit): 0 if no code or a syntax error; FENCE_CREDIT for a syntax error inside
  a proper fence; SYNTAX_CREDIT for valid code outside a fence; 1.0 for valid code in a ```python fence.
"""
from __future__ import annotations

import ast
import json
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
_HARNESS = r'''
import json, sys, traceback
def _run():
  nonce = sys.stdin.readline().strip()
  spec = json.load(open("tests.json", encoding="utf-8"))
  ns = {"__name__": "solution"}
  try:
    exec(compile(open("solution.py", encoding="utf-8").read(), "solution.py", "exec"), ns)
    for i, src in enumerate(spec["setup"]):
      exec(compile(src, f"setup_{i}", "exec"), ns)
  except BaseException:
    traceback.print_exc(limit=5)
    return
  for i, src in enumerate(spec["tests"]):
    try:
      exec(compile(src, f"test_{i}", "exec"), ns)
      ok = 1
    except BaseException:
      traceback.print_exc(limit=3)
      ok = 0
    sys.__stdout__.write(f"{nonce} {i} {ok}\n")
    sys.__stdout__.flush()
_run()
'''


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
  result = run_python(_HARNESS, timeout_s, memory_mb, stdin=nonce + "\n",
                      files={"solution.py": code, "tests.json": spec})
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
