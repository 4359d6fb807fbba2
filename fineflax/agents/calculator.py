"""The calculator-tool agent on multi-step arithmetic word problems (`fineflax.envs.word_problems`).

The model writes one expression per turn as <calc>12 + 5</calc>; the tool evaluates it with `safe_eval`
(an `ast` walk over a whitelist: numbers, + - * / // % **, unary -/+, parentheses — model text is never
passed to eval/exec) and the agent answers "Result: 17" in a user turn. The rollout ends when a turn has no
<calc> call (its last number is the answer, scored by the `math_last_number` reward) or after `max_calls`.
The system prompt is the resource "prompt_template" (APO optimises it).
"""
from __future__ import annotations

import ast
import operator
import re

from fineflax.agents.tracing import tool
from fineflax.rewards.math_reward import math_reward

CALC_PROMPT = ("Solve the word problem with a calculator. To calculate, write one expression like "
               "<calc>12 + 5</calc> and stop; you will get the result. Use one calculation per step. "
               "When you know the final number, write: The answer is N.")
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_CHARS, MAX_ABS, MAX_EXPONENT = 200, 1e15, 16
_CALL = re.compile(r"<calc>(.*?)(?:</calc>|$)", re.DOTALL)


class CalcError(ValueError):
  pass


def safe_eval(expr: str) -> int | float:
  """The value of an arithmetic expression; CalcError for anything outside the whitelist, division by zero,
  exponents above 16 or results beyond 1e15. Integral results are ints."""
  expr = expr.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
  if len(expr) > MAX_CHARS:
    raise CalcError(f"expression longer than {MAX_CHARS} characters")
  try:
    tree = ast.parse(expr, mode="eval")
  except SyntaxError:
    raise CalcError(f"not an arithmetic expression: {expr!r}") from None

  def ev(node):
    if isinstance(node, ast.Expression):
      return ev(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
      return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
      return _UNARY[type(node.op)](ev(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
      a, b = ev(node.left), ev(node.right)
      if isinstance(node.op, ast.Pow) and abs(b) > MAX_EXPONENT:
        raise CalcError(f"exponent {b} is above {MAX_EXPONENT}")
      try:
        v = _BINOPS[type(node.op)](a, b)
      except ZeroDivisionError:
        raise CalcError("division by zero") from None
      if isinstance(v, complex) or abs(v) > MAX_ABS:
        raise CalcError(f"result out of range in {expr!r}")
      return v
    raise CalcError(f"{type(node).__name__} is not allowed in {expr!r}")

  v = ev(tree)
  return int(v) if float(v).is_integer() else round(float(v), 6)


@tool(name="calculator")
def calculator(expr: str) -> str:
  """The tool: the value of `expr` as text, or "error: ..." (the model sees either)."""
  try:
    return str(safe_eval(expr))
  except CalcError as e:
    return f"error: {e}"


def parse_call(text: str) -> str | None:
  """The expression of the turn's first <calc> call (an unclosed one at the end counts), else None."""
  m = _CALL.search(text)
  return m.group(1) if m else None


class CalculatorAgent:
  """agent(task, llm, resources) -> reward; task = {"question": str, "answer": int}."""

  def __init__(self, max_calls: int = 4, max_tokens: int | None = None, temperature: float | None = None):
    self.max_calls, self.max_tokens, self.temperature = max_calls, max_tokens, temperature

  def rollout(self, task, llm, resources) -> float:
    messages = [{"role": "system", "content": resources.get("prompt_template", CALC_PROMPT)},
                {"role": "user", "content": task["question"]}]
    text = ""
    for _ in range(self.max_calls):
      text = llm.chat(messages, max_tokens=self.max_tokens, temperature=self.temperature, stop=["</calc>"]).text
      expr = parse_call(text)
      if expr is None:
        break
      messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"Result: {calculator(expr)}"}]
    return math_reward(task["question"], text, fallback_last_number=True, answer=str(task["answer"]))


def calculator_tasks(problems) -> list[dict]:
  """Agent tasks from `word_problems.Problem`s."""
  return [{"question": p.question, "answer": int(p.answer)} for p in problems]
