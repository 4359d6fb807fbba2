"""Math rewards against math-verify itself, graded the way LUFFY's released reward grades.

Each table row is (completion, ground truth, think gate, expected). The test computes math-verify's verdict
with LUFFY's own recipe (transcribed below from `luffy/verl/verl/mix_src/math_verify_reward.py` and the
reward manager in `main_mix_ppo.py`) and requires our reward, the reference and `expected` to agree.
"""
import pytest
from math_verify import parse, verify

from fineflax.rewards import extract_math_answer, get_reward, math_equal, score_completions
from fineflax.rewards import math_reward as M

pytestmark = pytest.mark.fast


def luffy_reference(response: str, ground_truth: str, think_format: bool) -> float:
  """LUFFY: the reward manager prepends "<think>\\n"; RewardMathFn gates on both tags and keeps
  split("</think>")[1]; labeling_responses verifies parse("$" + gt + "$") against parse(solution)."""
  model_response = "<think>" + "\n" + response
  if think_format:
    if "<think>" in model_response and "</think>" in model_response:
      model_solution = model_response.split("</think>")[1]
    else:
      return 0.0
  else:
    model_solution = response  # version 4 (no think) does not prepend the tag
  return float(verify(parse("$" + ground_truth + "$"), parse(model_solution)) is True)


TABLE = [
    ("\\boxed{[1,2)}", "(1,2]", False, 0.0),  # the interval whose ends differ: not equal
    ("\\boxed{(1,2]}", "(1,2]", False, 1.0),
    ("\\boxed{\\frac{3}{4}}", "0.75", False, 1.0),
    ("\\boxed{0.75}", "\\frac{3}{4}", False, 1.0),
    ("\\boxed{\\dfrac34}", "0.75", False, 1.0),
    ("The answer is $\\frac{1}{2}$.", "\\frac12", False, 1.0),
    ("\\boxed{50\\%}", "0.5", False, 1.0),
    ("\\boxed{50\\%}", "50", False, 1.0),
    ("\\boxed{1,000}", "1000", False, 1.0),
    ("\\boxed{1.5\\times10^{3}}", "1500", False, 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\sqrt{2}/2", False, 1.0),
    ("\\boxed{2x+2}", "2(x+1)", False, 1.0),
    ("\\boxed{x^2-1}", "(x-1)(x+1)", False, 1.0),
    ("\\boxed{(1, 2)}", "(1,2)", False, 1.0),
    ("\\boxed{(2, 1)}", "(1,2)", False, 0.0),
    ("\\boxed{x=5}", "5", False, 1.0),
    ("\\boxed{5}", "x=5", False, 1.0),
    ("\\boxed{-0.5}", "-\\frac{1}{2}", False, 1.0),
    ("\\boxed{3.14159265358979}", "\\pi", False, 1.0),
    ("\\boxed{0.333333}", "\\frac{1}{3}", False, 1.0),
    ("\\boxed{0.334}", "\\frac{1}{3}", False, 0.0),
    ("\\boxed{90^\\circ}", "90", False, 1.0),
    ("\\boxed{1000001}", "1000000", False, 0.0),
    ("\\boxed{2y}", "2x", False, 0.0),
    ("\\boxed{\\{1,2\\}}", "\\{2,1\\}", False, 1.0),
    ("\\boxed{[0,\\infty)}", "[0,\\infty)", False, 1.0),
    ("\\boxed{x \\geq 0}", "[0,\\infty)", False, 0.0),
    ("\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", False, 1.0),
    ("\\boxed{\\text{(B)}}", "B", False, 1.0),
    ("\\boxed{1} and then \\boxed{2}", "2", False, 0.0),
    ("The answer is 72", "72", False, 1.0),
    ("<answer>7</answer>", "7", False, 0.0),  # math-verify reads no answer tags
    ("no answer here", "7", False, 0.0),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", False, 1.0),
    ("\\boxed{e^{i\\pi}}", "-1", False, 0.0),
    # the </think> gate (LUFFY reward version 3)
    ("reasoning</think>\\boxed{72}", "72", True, 1.0),
    ("reasoning \\boxed{72}", "72", True, 0.0),  # no closing tag: no reward, whatever the answer
    ("reasoning \\boxed{71}</think>\\boxed{72}", "72", True, 1.0),
    ("reasoning \\boxed{72}</think>\\boxed{71}", "72", True, 0.0),  # only the text after </think> counts
    ("a</think>\\boxed{72}</think>\\boxed{71}", "72", True, 1.0),  # ... up to a second </think>
    ("a</think>so 71</think>\\boxed{72}", "72", True, 0.0),
    ("a</think>", "72", True, 0.0),
    ("<think>a</think>\\boxed{\\frac{7}{4}}", "\\frac{7}{4}", True, 1.0),
]


def test_table_is_large_enough():
  assert len(TABLE) >= 30 and len({(c, g, t) for c, g, t, _ in TABLE}) == len(TABLE)


@pytest.mark.parametrize("completion,truth,gate,expected", TABLE)
def test_reward_agrees_with_math_verify(completion, truth, gate, expected):
  reference = luffy_reference(completion, truth, gate)
  ours = get_reward("math_think" if gate else "math")("", completion, ground_truth=truth)
  assert (ours, reference) == (expected, expected)


def test_no_closing_tag_scores_zero_only_with_the_gate():
  assert get_reward("math_think")("", "\\boxed{72}", ground_truth="72") == 0.0
  assert get_reward("math")("", "\\boxed{72}", ground_truth="72") == 1.0


def test_reference_fields():
  math = get_reward("math")
  assert math("", "\\boxed{72}", answer="72") == 1.0
  assert math("", "\\boxed{72}", answer="She pays 8 * 9 = 72 dollars.\n#### 72") == 1.0  # GSM8K
  assert math("", "\\boxed{\\frac{1}{2}}", solution="So $x = \\boxed{0.5}$.") == 1.0  # MATH
  assert math("", "\\boxed{71}", answer="72") == 0.0
  with pytest.raises(KeyError, match="answer"):
    math("", "\\boxed{1}", question="no reference")


def test_extraction_rules_of_math_last_number():
  assert extract_math_answer("so \\boxed{\\boxed{5}} done") == "5"
  assert extract_math_answer("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
  assert extract_math_answer("\\boxed{3} then \\boxed{4") == "3"  # the unclosed box is ignored
  assert extract_math_answer("\\boxed{4") is None
  assert extract_math_answer("<answer> 7 </answer>") == "7"
  assert extract_math_answer("it is 42.") is None
  assert extract_math_answer("it is 1,234.", fallback_last_number=True) == "1,234"
  last = get_reward("math_last_number")
  assert last("", "<think>x</think><answer>14</answer>", answer="14") == 1.0
  assert last("", "so it is 1,234.", answer="1234") == 1.0
  assert last("", "\\boxed{1} then \\boxed{2}", answer="2") == 1.0  # the last box, unlike math-verify
  assert last("", "The answer is 72", answer="71") == 0.0


@pytest.mark.parametrize("pred,ref", [("3/4", "\\frac{3}{4}"), ("1,000", "1000"), ("x=5", "5"), ("3", "4"),
                                      ("", ""), ("(1,2)", "(2,1)")])
def test_math_equal_is_math_verify_on_bare_answers(pred, ref):
  expected = bool(pred.strip()) and verify(parse("$" + ref + "$"), parse("$" + pred + "$"))
  assert math_equal(pred, ref) is expected


@pytest.fixture
def short_timeout(monkeypatch):
  monkeypatch.setattr(M, "TIMEOUT_S", 1)


@pytest.mark.parametrize("completion,truth", [("\\boxed{10^{10^{10}}}", "1"), ("\\boxed{9^{9^{9}}}", "3"),
                                              ("(" * 500 + "1" + ")" * 500, "1")])
def test_huge_inputs_are_wrong_not_stuck(short_timeout, completion, truth):
  assert get_reward("math")("", completion, ground_truth=truth) == 0.0


def test_hostile_text_is_not_executed(tmp_path):
  marker = tmp_path / "pwned"
  for text in (f"__import__('os').system('touch {marker}')", f"\\boxed{{__import__('os').system('touch {marker}')}}",
               f"The final answer is (lambda: __import__('os').system('touch {marker}'))()"):
    assert get_reward("math")("", text, ground_truth="0") == 0.0
  assert not marker.exists()


def test_worker_threads_grade_in_processes(short_timeout):
  """Off the main thread math-verify cannot set its alarms; the pool keeps its verdicts and timeouts."""
  completions = ["\\boxed{10^{10^{10}}}", "\\boxed{2(x+1)}", "\\boxed{[1,2)}", "x</think>\\boxed{3/4}"]
  examples = [{"answer": "1"}, {"answer": "2x+2"}, {"answer": "(1,2]"}, {"answer": "0.75"}]
  total, per_fn, errors = score_completions({"math": 1.0, "math_think": 1.0}, [""] * 4, completions, examples,
                                            max_workers=3)
  assert per_fn["math"].tolist() == [0.0, 1.0, 0.0, 1.0] and per_fn["math_think"].tolist() == [0, 0, 0, 1.0]
  assert errors == {"math": 0, "math_think": 0}


def test_math_last_number_extracts_the_reference_answer_as_it_extracts_the_completion_answer():
  last = get_reward("math_last_number")
  # a reference sentence (the assistant turn of an eval row from `from_feedback --holdout-out`)
  assert last("", "90 + 23 = 113.", answer="90 + 23 = 113.") == 1.0
  assert last("", "The total is 113", answer="She has 90 + 23 = 113 apples.") == 1.0
  assert last("", "90 + 23 = 114.", answer="90 + 23 = 113.") == 0.0
  assert last("", "\\boxed{113}", answer="It is <answer>113</answer>, from 90 + 23.") == 1.0  # tags before numbers
  assert last("", "12", answer="twelve") == 0.0  # no number in the reference: compared whole
