"""Equivalence of two final math answers: normalised string, then numeric, then symbolic.

- String: `normalize_math` strips $, \\left/\\right, spacing commands, \\text{}, degrees, a leading `x=`,
  a trailing period and spaces; \\dfrac/\\tfrac -> \\frac.
- Numeric: ints, decimals, thousands separators (1,234), fractions 3/4 and \\frac{3}{4}, percentages
  (50% equals both 50 and 0.5), scientific notation (1.5e3, 1.5\\times10^{3}); parsed exactly with
  `decimal.Decimal`; equal iff a == b, or, unless both are integers, |a - b| <= 1e-6 * max(|a|, |b|).
- Symbolic: a LaTeX subset is rewritten to Python syntax, parsed with `ast.parse` and converted node by node
  to sympy (whitelisted operators, functions and names; no `sympify`/`eval`). Inputs longer than
  `MAX_EXPR_CHARS`, integer literals over `MAX_INT_DIGITS` digits, and numeric powers whose result would
  exceed `MAX_POW_DIGITS` digits are rejected (so `10**10**10` returns at once). Equal iff a - b is ~0 at
  three fixed points for its free symbols (evalf, same tolerance), under a `SYMBOLIC_TIMEOUT_S` timeout.
- Tuples: answers with top-level commas compare element-wise.
"""
from __future__ import annotations

import ast
import concurrent.futures
import decimal
import math
import re
import signal
import threading

import sympy

MAX_EXPR_CHARS = 200
MAX_INT_DIGITS = 100
MAX_POW_DIGITS = 1000
SYMBOLIC_TIMEOUT_S = 2.0
REL_TOL = decimal.Decimal("1e-6")

_CTX = decimal.Context(prec=60, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
_SPACING = re.compile(r"\\[!,;: ]|~|\\left|\\right|\\displaystyle|\$")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox|operatorname)\{([^{}]*)\}")
_DEGREE = re.compile(r"\^\{?\\circ\}?|\\circ|°")
_LEADING_VAR = re.compile(r"^[a-zA-Z]\w*=(?!=)")
_FRAC_SHORT = re.compile(r"\\frac(\d)(\d)")
_NUM = r"[+-]?(?:\d++(?:\.\d*+)?|\.\d++)(?:e[+-]?\d++)?"  # possessive: no backtracking
_DECIMAL = re.compile(_NUM, re.IGNORECASE)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_SLASH_FRAC = re.compile(rf"({_NUM})/({_NUM})", re.IGNORECASE)
_LATEX_FRAC = re.compile(rf"([+-]?)\\frac\{{({_NUM})\}}\{{({_NUM})\}}", re.IGNORECASE)
_LATEX_SCI = re.compile(rf"({_NUM})(?:\\times|\\cdot|\*)10\^\{{?([+-]?\d+)\}}?", re.IGNORECASE)
_FUNCS = {"sqrt": sympy.sqrt, "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "log": sympy.log,
          "ln": sympy.log, "exp": sympy.exp}
_CONSTS = {"pi": sympy.pi, "e": sympy.E, "oo": sympy.oo, "inf": sympy.oo}
_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|(sqrt|sin|cos|tan|log|ln|exp|pi|oo|inf)|([a-zA-Z])|(\*\*|[-+*/(),]))")
_PROBES = (sympy.Rational(37, 100), sympy.Rational(191, 100), sympy.Rational(-23, 10))


def normalize_math(s: str) -> str:
  s = _SPACING.sub("", s.strip())
  s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\%", "%")
  s = _TEXT.sub(r"\1", s)
  s = _DEGREE.sub("", s)
  s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
  s = s.replace(" ", "").rstrip(".")
  return _LEADING_VAR.sub("", s)


def _decimal(text: str) -> decimal.Decimal | None:
  try:
    return decimal.Decimal(text) if _DECIMAL.fullmatch(text) else None  # exact, any length
  except (decimal.InvalidOperation, ValueError):
    return None


def parse_number(s: str) -> list[decimal.Decimal]:
  """Candidate values of a normalised numeric answer ([] if not numeric; two for a percentage)."""
  percent = s.endswith("%")
  s = s[:-1] if percent else s
  if _THOUSANDS.fullmatch(s):
    s = s.replace(",", "")
  value = None
  try:
    if m := _LATEX_FRAC.fullmatch(s):
      num, den = _decimal(m.group(2)), _decimal(m.group(3))
      if num is not None and den:
        value = _CTX.divide(num, den) * (-1 if m.group(1) == "-" else 1)
    elif m := _SLASH_FRAC.fullmatch(s):
      num, den = _decimal(m.group(1)), _decimal(m.group(2))
      if num is not None and den:
        value = _CTX.divide(num, den)
    elif m := _LATEX_SCI.fullmatch(s):
      mant = _decimal(m.group(1))
      if mant is not None and len(m.group(2)) < 12:
        value = _CTX.scaleb(mant, int(m.group(2)))
    else:
      value = _decimal(s)
  except (decimal.DecimalException, ArithmeticError):
    return []
  if value is None:
    return []
  return [value, _CTX.divide(value, 100)] if percent else [value]


def _close(a: decimal.Decimal, b: decimal.Decimal) -> bool:
  try:
    if a == b:
      return True
    if a == a.to_integral_value() and b == b.to_integral_value():
      return False  # two integers must match exactly (1e-6 would equate 1000000 and 1000001)
    diff = abs(_CTX.subtract(a, b))
    return diff <= _CTX.multiply(REL_TOL, max(abs(a), abs(b)))
  except decimal.DecimalException:
    return False


def _latex_to_python(s: str) -> str:
  s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\pi", "pi").replace("\\infty", "oo")
  s = s.replace("\\ln", "ln").replace("\\log", "log").replace("\\exp", "exp")
  s = re.sub(r"\\(sin|cos|tan)", r"\1", s)
  for _ in range(20):  # innermost-first rewrites of \frac{a}{b} and \sqrt[n]{x} / \sqrt{x}
    new = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
    new = re.sub(r"\\sqrt\[([^\[\]{}]*)\]\{([^{}]*)\}", r"((\2)**(1/(\1)))", new)
    new = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", new)
    if new == s:
      break
    s = new
  return s.replace("{", "(").replace("}", ")").replace("^", "**")


def _implicit_mul(s: str) -> str | None:
  """Tokenise with whitelisted names and insert `*` for implicit products (2x, 2(x+1), x y, )( )."""
  out, pos, prev = [], 0, None  # prev: "operand", "func", "op", "open"
  while pos < len(s):
    m = _TOKEN.match(s, pos)
    if not m:
      return None if s[pos:].strip() else "".join(out)
    pos = m.end()
    num, name, letter, op = m.groups()
    if num or letter or (name and name not in _FUNCS):
      kind = "operand"
    elif name:
      kind = "func"
    elif op == "(":
      kind = "open"
    elif op == ")":
      kind = "operand"
    else:
      kind = "op"
    starts_operand = kind in ("operand", "func", "open") and op != ")"
    if prev == "operand" and starts_operand:
      out.append("*")
    out.append(m.group(0).strip())
    prev = kind
  return "".join(out)


def _to_sympy(node: ast.AST) -> sympy.Expr:
  if isinstance(node, ast.Expression):
    return _to_sympy(node.body)
  if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
    if isinstance(node.value, float):
      if not math.isfinite(node.value):
        raise ValueError("non-finite literal")
      return sympy.Rational(repr(node.value))
    if node.value.bit_length() > MAX_INT_DIGITS * 3.33:
      raise ValueError("integer literal too large")
    return sympy.Integer(node.value)
  if isinstance(node, ast.Name):
    if node.id in _CONSTS:
      return _CONSTS[node.id]
    if len(node.id) == 1 and node.id.isalpha():
      return sympy.Symbol(node.id)
    raise ValueError(f"name {node.id!r} not allowed")
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
    operand = _to_sympy(node.operand)
    return -operand if isinstance(node.op, ast.USub) else operand
  if isinstance(node, ast.BinOp):
    a, b = _to_sympy(node.left), _to_sympy(node.right)
    if isinstance(node.op, ast.Add):
      return a + b
    if isinstance(node.op, ast.Sub):
      return a - b
    if isinstance(node.op, ast.Mult):
      return a * b
    if isinstance(node.op, ast.Div):
      return a / b
    if isinstance(node.op, ast.Pow):
      if a.is_number and b.is_number:
        base, exp = abs(complex(a.evalf(15))), abs(complex(b.evalf(15)))
        digits = exp * abs(math.log10(base)) if base not in (0.0, 1.0) else 0.0
        if not math.isfinite(exp) or digits > MAX_POW_DIGITS or exp > 10 * MAX_POW_DIGITS:
          raise ValueError("power too large")
      return a ** b
  if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
      and not node.keywords and 1 <= len(node.args) <= 2):
    return _FUNCS[node.func.id](*[_to_sympy(arg) for arg in node.args])
  raise ValueError(f"unsupported syntax {type(node).__name__}")


def to_sympy(s: str) -> sympy.Expr | None:
  """Safe parse of a normalised answer into sympy (None when rejected or unparsable)."""
  if len(s) > MAX_EXPR_CHARS:
    return None
  code = _implicit_mul(_latex_to_python(s))
  if not code:
    return None
  try:
    return _to_sympy(ast.parse(code, mode="eval"))
  except (SyntaxError, ValueError, TypeError, ArithmeticError, RecursionError, MemoryError, OverflowError):
    return None


def _symbolic_equal(a: sympy.Expr, b: sympy.Expr) -> bool:
  symbols = sorted(a.free_symbols | b.free_symbols, key=str)
  points = [dict(zip(symbols, _PROBES[i:] + _PROBES[:i])) for i in range(len(_PROBES))] if symbols else [{}]
  for point in points:
    va, vb = complex(a.evalf(30, subs=point)), complex(b.evalf(30, subs=point))
    if not (math.isfinite(abs(va)) and math.isfinite(abs(vb))):
      return False
    if abs(va - vb) > float(REL_TOL) * max(abs(va), abs(vb)) and abs(va - vb) > 1e-12:
      return False
  return True


class _Timeout(Exception):
  pass


_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="math_equiv")


def call_with_timeout(fn, timeout_s: float):
  """fn() or raises TimeoutError. Main thread: SIGALRM interrupts fn. Other threads: fn runs on a daemon
  pool thread that is abandoned (not stopped) on timeout; the size limits above keep that rare."""
  if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
    def on_alarm(signum, frame):
      raise _Timeout()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
      return fn()
    except _Timeout:
      raise TimeoutError(f"timed out after {timeout_s} s") from None
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, old)
  try:
    return _POOL.submit(fn).result(timeout=timeout_s)
  except concurrent.futures.TimeoutError:
    raise TimeoutError(f"timed out after {timeout_s} s") from None


def _split_top_level(s: str) -> list[str]:
  parts, depth, start = [], 0, 0
  for i, ch in enumerate(s):
    depth += ch in "([{"
    depth -= ch in ")]}"
    if ch == "," and depth == 0:
      parts.append(s[start:i])
      start = i + 1
  parts.append(s[start:])
  return parts


def _strip_brackets(s: str) -> str:
  return s[1:-1] if len(s) >= 2 and s[0] in "([{" and s[-1] in ")]}" else s


def _equal_scalar(a: str, b: str) -> bool:
  if a == b:
    return True
  na, nb = parse_number(a), parse_number(b)
  if na and nb:
    return any(_close(x, y) for x in na for y in nb)
  ea, eb = to_sympy(a), to_sympy(b)
  if ea is None or eb is None:
    return False
  try:
    return bool(call_with_timeout(lambda: _symbolic_equal(ea, eb), SYMBOLIC_TIMEOUT_S))
  except Exception:  # sympy can raise many things on odd inputs; unequal is the safe answer
    return False


def math_equal(pred: str, ref: str) -> bool:
  """True iff the two answers are equivalent (string, numeric or symbolic, see module docstring)."""
  a, b = normalize_math(pred), normalize_math(ref)
  if a == b:
    return bool(a)
  if not _THOUSANDS.fullmatch(a.rstrip("%")) and not _THOUSANDS.fullmatch(b.rstrip("%")):
    pa, pb = _split_top_level(_strip_brackets(a)), _split_top_level(_strip_brackets(b))
    if len(pa) > 1 or len(pb) > 1:
      return len(pa) == len(pb) and all(_equal_scalar(x, y) for x, y in zip(pa, pb))
  return _equal_scalar(a, b)
