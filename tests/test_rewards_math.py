"""Math answer extraction and equivalence, incl. adversarial inputs (huge numbers, unsafe text)."""
import time

import pytest

from fineflax.rewards import extract_math_answer, get_reward, math_equal

EQUAL = [("3/4", "\\frac{3}{4}"), ("0.75", "\\dfrac34"), ("50\\%", "0.5"), ("50%", "50"), ("1,000", "1000"),
         ("1.5e3", "1500"), ("1.5\\times10^{3}", "1500"), ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"),
         ("2x+2", "2(x+1)"), ("x^2-1", "(x-1)(x+1)"), ("(1,2)", "(1, 2)"), ("x=5", "5"), ("-\\frac{1}{2}", "-0.5"),
         ("\\pi", "3.14159265358979"), ("0.3333333", "1/3"), ("$12$", "12."), ("90^\\circ", "90")]
UNEQUAL = [("3", "4"), ("(1,2)", "(2,1)"), ("1000000", "1000001"), ("1e400", "1e500"), ("2x", "2y"),
           ("", ""), ("0.334", "1/3"), ("x^2", "x^3")]


@pytest.mark.parametrize("a,b", EQUAL)
def test_equivalent_pairs(a, b):
  assert math_equal(a, b) and math_equal(b, a)


@pytest.mark.parametrize("a,b", UNEQUAL)
def test_unequal_pairs(a, b):
  assert not math_equal(a, b)


@pytest.mark.parametrize("a,b,expected", [
    ("10**10**10", "1", False), ("10^{10^{10}}", "5", False), ("9^{9^{9}}", "3", False),
    ("5" * 5000, "5" * 5000, True), ("5" * 5000, "5" * 4999 + "4", False), ("1e999999999", "1", False),
    ("__import__('os').system('touch /tmp/pwned')", "0", False), ("(" * 500 + "1" + ")" * 500, "1", False)])
def test_huge_and_hostile_inputs_return_fast(a, b, expected):
  start = time.monotonic()
  assert math_equal(a, b) is expected
  assert time.monotonic() - start < 1.0


def test_extraction_rules():
  assert extract_math_answer("so \\boxed{\\boxed{5}} done") == "5"
  assert extract_math_answer("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
  assert extract_math_answer("\\boxed{3} then \\boxed{4") == "3"  # the unclosed box is ignored
  assert extract_math_answer("\\boxed{4") is None
  assert extract_math_answer("<answer> 7 </answer>") == "7"
  assert extract_math_answer("it is 42.") is None
  assert extract_math_answer("it is 1,234.", fallback_last_number=True) == "1,234"


def test_math_reward_uses_reference_fields():
  math = get_reward("math")
  assert math("", "\\boxed{72}", answer="72") == 1.0
  assert math("", "\\boxed{72}", answer="She pays 8 * 9 = 72 dollars.\n#### 72") == 1.0
  assert math("", "\\boxed{\\frac{1}{2}}", solution="So $x = \\boxed{0.5}$.") == 1.0
  assert math("", "\\boxed{71}", answer="72") == 0.0
  assert math("", "The answer is 72", answer="72") == 0.0
  assert get_reward("math_last_number")("", "The answer is 72", answer="72") == 1.0
  with pytest.raises(KeyError, match="answer"):
    math("", "\\boxed{1}", question="no reference")


def test_math_last_number_extracts_the_reference_answer_as_it_extracts_the_completion_answer():
  last = get_reward("math_last_number")
  # a reference sentence (the assistant turn of an eval row from `from_feedback --holdout-out`)
  assert last("", "90 + 23 = 113.", answer="90 + 23 = 113.") == 1.0
  assert last("", "The total is 113", answer="She has 90 + 23 = 113 apples.") == 1.0
  assert last("", "90 + 23 = 114.", answer="90 + 23 = 113.") == 0.0
  assert last("", "\\boxed{113}", answer="It is <answer>113</answer>, from 90 + 23.") == 1.0  # tags before numbers
  assert last("", "12", answer="twelve") == 0.0  # no number in the reference: compared whole
  assert get_reward("math")("", "\\boxed{113}", answer="90 + 23 = 113.") == 0.0  # `math` keeps the whole reference
