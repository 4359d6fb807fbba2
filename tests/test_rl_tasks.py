"""Toy arithmetic tasks: determinism, disjoint splits, difficulty knob, solver correctness, trace export."""
from __future__ import annotations

import json
import re

import pytest

from fineflax.envs.word_problems import ITEMS, NAMES, generate_problems, write_traces
from fineflax.rl.traces import load_traces

pytestmark = pytest.mark.fast

_OPS = {"gets (\\d+) more": "+", "gives away (\\d+)": "-", "ends up with (\\d+) times as many": "*",
        "splits the \\w+ into (\\d+) equal groups": "/"}


def _evaluate_question(question: str) -> int:
  """Independent reading of the question text: start count, then each 'Then ...' sentence."""
  start = int(re.match(r"\w+ has (\d+) \w+\.", question).group(1))
  value = start
  for sentence in re.findall(r"Then [^.]*\.", question):
    (pattern, op), = [(p, o) for p, o in _OPS.items() if re.search(p, sentence)]
    x = int(re.search(pattern, sentence).group(1))
    value = {"+": value + x, "-": value - x, "*": value * x, "/": value // x}[op]
  return value


@pytest.fixture(scope="module")
def problems():
  return {split: generate_problems(400, split, seed=3) for split in ("train", "test")}


def test_deterministic_per_seed(problems):
  assert generate_problems(400, "train", seed=3) == problems["train"]
  assert generate_problems(50, "train", seed=4) != problems["train"][:50]


def test_splits_disjoint(problems):
  train_q = {p.question for p in problems["train"]}
  test_q = {p.question for p in problems["test"]}
  assert len(train_q) == 400 and len(test_q) == 400 and not train_q & test_q
  assert {p.split for p in problems["train"]} == {"train"} and {p.split for p in problems["test"]} == {"test"}
  other_seed = {p.question for p in generate_problems(400, "test", seed=99)}
  assert not train_q & other_seed


def test_solver_answers_and_steps_are_correct(problems):
  for p in problems["train"] + problems["test"]:
    assert p.answer == _evaluate_question(p.question)
    m = re.fullmatch(r"<think>\n(.*)\n</think><answer>(-?\d+)</answer>", p.solution, flags=re.S)
    assert m and int(m.group(2)) == p.answer
    steps = m.group(1).split("\n")
    assert len(steps) == p.num_steps
    prev = int(re.match(r"\w+ has (\d+)", p.question).group(1))
    for s, line in enumerate(steps, 1):
      a, op, b, c = re.fullmatch(rf"Step {s}: (\d+) ([-+*/]) (\d+) = (\d+)", line).groups()
      a, b, c = int(a), int(b), int(c)
      assert a == prev and 0 <= c <= 1000
      assert c == {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op] and (op != "/" or a % b == 0)
      prev = c
    assert prev == p.answer


@pytest.mark.parametrize("steps", [1, 3, 5])
def test_difficulty_knob(steps):
  ps = generate_problems(30, "test", num_steps=steps, seed=0)
  assert all(p.num_steps == steps and p.question.count("Then ") == steps for p in ps)
  assert any(name in ps[0].question for name in NAMES) and any(item in ps[0].question for item in ITEMS)


def test_number_size_knobs():
  ps = generate_problems(80, "train", num_steps=1, seed=0, max_start=9, max_addend=4)  # 81 such training problems exist
  starts = [int(re.search(r"has (\d+) ", p.question).group(1)) for p in ps]
  adds = [int(re.search(r"gets (\d+) more", p.question).group(1)) for p in ps if "gets" in p.question]
  assert 2 <= min(starts) and max(starts) == 9 and adds and max(adds) == 4 and min(adds) == 1
  with pytest.raises(ValueError, match="max_start=1"):
    generate_problems(3, max_start=1)
  with pytest.raises(RuntimeError, match="could only find .* problems of distinct content"):
    generate_problems(200, "train", num_steps=1, seed=0, max_start=9, max_addend=4)


def test_bad_arguments():
  with pytest.raises(ValueError, match="num_steps must lie in 1..5"):
    generate_problems(3, num_steps=6)
  with pytest.raises(ValueError, match="split must be one of"):
    generate_problems(3, split="dev")


def test_write_traces_luffy_jsonl_round_trip(tmp_path, problems):
  ps = problems["test"][:20]
  path = write_traces(tmp_path / "sub" / "arith.jsonl", ps)
  assert [p.name for p in path.parent.iterdir()] == ["arith.jsonl"]  # no temp file left
  first = json.loads(path.read_text().splitlines()[0])
  assert first["reward_model"]["ground_truth"] == str(ps[0].answer)
  assert first["target"][0]["role"] == "assistant" and first["prompt"][0]["role"] == "user"
  traces = load_traces(path)
  assert [(t.question, t.response, t.answer) for t in traces] == [(p.question, p.solution, str(p.answer)) for p in ps]
