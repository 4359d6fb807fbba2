"""Evaluation sets of the arithmetic env: a second wording of the same problems, a validation split disjoint
from the test split (which stays the earlier held-out set), OOD sets, and pass@k from k samples."""
import dataclasses

import numpy as np
import pytest

from fineflax.envs import arithmetic
from fineflax.envs.word_problems import generate_problems, make_problem
from fineflax.jobs.resolve import load_config

pytestmark = pytest.mark.fast


def test_second_wording_keeps_problem_answer_and_split():
  a = generate_problems(20, "test", (2, 3), 7, 20, 10)
  b = generate_problems(20, "test", (2, 3), 7, 20, 10, template="box")
  assert [p.key for p in a] == [p.key for p in b] and [p.answer for p in a] == [p.answer for p in b]
  assert all(x.question != y.question and y.question.startswith("A box holds") for x, y in zip(a, b))
  p = make_problem("Mia", "apples", 12, [("+", 5), ("-", 3), ("*", 2), ("/", 4)], template="box")
  assert p.answer == 7 and "puts 5 more apples into the box" in p.question
  with pytest.raises(ValueError, match="template must be one of"):
    generate_problems(2, "test", template="poem")


def _env(over=()):
  config = load_config("configs/luffy_arith.py:smoke", ["task.num_eval=12", *over])
  return config, arithmetic.ArithmeticEnv(config, tokenizer=None)


def test_validation_split_is_disjoint_from_test_which_is_unchanged():
  config, test = _env()
  _, val = _env(["task.eval_split=validation"])
  t = config.task
  assert [p.key for p in test.eval_items] == [p.key for p in generate_problems(12, "test", (2, 3), t.eval_seed,
                                                                                 max_start=20, max_addend=10)]
  assert len(val.eval_items) == 12 and not {p.key for p in val.eval_items} & {p.key for p in test.eval_items}
  assert {p.num_steps for p in test.extra_eval_sets["ood_ops"]} <= {4, 5}
  assert [p.answer for p in test.extra_eval_sets["ood_phrasing"]] == [p.answer for p in test.eval_items]
  with pytest.raises(ValueError, match="eval_split='train'"):  # at resolve time (Env.validate), before weights load
    arithmetic.ArithmeticEnv.validate(load_config("configs/luffy_arith.py:smoke", ["task.eval_split=train"]))


@dataclasses.dataclass(frozen=True)
class FakePolicy:
  """Greedy: right on problems 0, 4, 8 ...; sampled: only the first sample of even problems is right."""
  problems: tuple
  temperature: float = 1.0
  top_p: float = 1.0

  def sample(self, prompts, rng=None, greedy=False):
    seen, texts = {}, []
    for p in prompts:
      i = p[0]
      copy = seen.get(i, 0)
      seen[i] = copy + 1
      right = i % 4 == 0 if greedy else (i % 2 == 0 and copy == 0)
      texts.append(f"<answer>{self.problems[i].answer if right else -1}</answer>")
    n = len(texts)
    mask = np.ones((n, 3))
    return type("Out", (), dict(texts=texts, lengths=np.full(n, 3), mask=mask, logprobs=-0.5 * mask))


def test_pass_at_k_counts_a_problem_once_any_sample_is_right(monkeypatch):
  config, env = _env(["task.pass_k=4", "task.pass_k_items=0", "eval_batch_size=5"])
  index = {p.question: i for i, p in enumerate(env.eval_items)}
  monkeypatch.setattr(arithmetic, "prompt_ids", lambda tok, system, question, prefix="": [index[question]])
  m = env.evaluate(FakePolicy(tuple(env.eval_items)), env.eval_items)
  assert m["eval_accuracy"] == pytest.approx(3 / 12)  # problems 0, 4, 8
  assert m["eval_pass_at_4"] == pytest.approx(6 / 12)  # every even problem, from one right sample of 4
  assert m["eval_sample_accuracy"] == pytest.approx(6 / 48)
  assert m["eval_sample_entropy"] == pytest.approx(0.5)
