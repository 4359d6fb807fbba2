"""The `code` reward (`fineflax.rewards.code_reward`): the fraction of tests a completion's program passes,
run in the sandbox; hostile programs (loops, exits, forged result lines, always-equal objects, a nonce
thief) score 0; common test styles and HumanEval's check(candidate) work; a bad tests source names its field."""
import time

import pytest

from fineflax.rewards import get_reward
from fineflax.rewards.code_reward import split_tests
from fineflax.testing import sandbox_hostile


def test_code_reward_fraction_of_tests():
  code = get_reward("code")
  completion = "Here:\n```python\ndef add(a, b):\n    return a + b\n```\n"
  tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add(-1, 1) == 0"]
  assert code("", completion, tests=tests) == pytest.approx(2 / 3)
  assert code("", completion, tests="import math\nassert add(1, 1) == 2\nassert add(0, 0) == math.pi\n") == 0.5


def test_code_reward_adversarial_programs_score_zero():
  code = get_reward("code")
  tests = ["assert f() == 1"]
  start = time.monotonic()
  assert code("", "```python\nwhile True: pass\n```", tests=tests, timeout_s=1.0) == 0.0
  assert time.monotonic() - start < 3.0
  assert code("", "```python\nimport sys\nsys.exit(0)\n```", tests=tests) == 0.0
  assert code("", "```python\nimport os\nos._exit(0)\n```", tests=tests) == 0.0
  forged = "```python\nprint('0 0 1')\ndef f():\n    return 2\n```"  # fake result line: no nonce
  assert code("", forged, tests=tests) == 0.0
  assert code("", "```python\ndef f(:\n```", tests=tests) == 0.0


def test_code_reward_compares_plain_values_outside_the_solution():
  """Regression (issue 36): an object whose __eq__ always returns True scored 1.0."""
  code = get_reward("code")
  completion = f"```python\n{sandbox_hostile.ALWAYS_EQUAL}```"
  assert code("", completion, tests=["assert f(1) == 2", "assert f(2) == [1, 2]", "assert g(0) == 3"]) == 0.0
  check = "def check(candidate):\n    assert candidate(2) == 4\n"
  assert code("", completion, tests=check, entry_point="f") == 0.0


def test_code_reward_nonce_cannot_be_found_or_forged():
  """Regression (issue 36): a solution read the harness's nonce from its caller's frame and printed
  passing result lines (1.0 for a wrong answer). Here it also searches gc, /proc and the test file."""
  code = get_reward("code")
  completion = f"```python\n{sandbox_hostile.FORGER}```"
  assert code("", completion, tests=["assert f() == 1", "assert f() == 2", "assert f() == 3"]) == 0.0
  assert code("", completion, tests=["assert f() == 0", "assert f() == 2"]) == 0.5  # it still runs


def test_code_reward_plain_values_cover_common_test_styles():
  code = get_reward("code")
  solution = """```python
import collections
Point = collections.namedtuple("Point", "x y")
class Solution:
    def two_sum(self, nums, target):
        seen = {}
        for i, n in enumerate(nums):
            if target - n in seen:
                return [seen[target - n], i]
            seen[n] = i
def half(x):
    print("computing", x)  # printing does not disturb the results
    if x < 0:
        raise ValueError("negative")
    return x / 2
def squares(n):
    yield from (i * i for i in range(n))
def point():
    return Point(1, 2)
def counts(s):
    return collections.Counter(s)
LIMIT = 10
```"""
  tests = ["assert Solution().two_sum([2, 7, 11], 9) == [0, 1]",
           "assert abs(half(3) - 1.5) < 1e-9 and half(4) == 2",
           "try:\n    half(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)\nelse:\n    raise AssertionError",
           "assert list(squares(4)) == [0, 1, 4, 9] and 9 in squares(4)",
           "assert point() == (1, 2) and point()[1] == 2",
           "assert counts('aab') == {'a': 2, 'b': 1} and LIMIT == 10",
           "assert half(2) == 5"]
  assert code("", solution, tests=tests) == pytest.approx(6 / 7)


def test_code_reward_humaneval_check_and_partial_credit():
  code = get_reward("code")
  check = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"
  assert code("", "```python\ndef sq(x):\n    return x * x\n```", tests=check, entry_point="sq") == 1.0
  assert code("", "```python\ndef sq(x):\n    return x + x\n```", tests=check, entry_point="sq") == 0.0
  assert code("", "```python\nx = 1\n```") == 1.0
  assert code("", "```python\nx = (\n```") == pytest.approx(0.2)
  assert code("", "x = 1") == pytest.approx(0.8)
  assert code("", "x = (") == 0.0 and code("", "   ") == 0.0


def test_split_tests_bad_source_names_the_field():
  with pytest.raises(ValueError, match="tests"):
    split_tests("assert (", None)
  with pytest.raises(ValueError, match="tests"):
    split_tests(42, None)
