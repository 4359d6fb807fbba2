"""No held-out arithmetic problem has a training twin: a training problem with the same mathematical content
(start value, operations and operands in order; equivalently the same worked solution), for any seed, in
the settings of every preset of the configs that train on word problems."""
from __future__ import annotations

import re

import ml_collections
import pytest

from configs import distill, grpo_arith, luffy_arith
from fineflax.envs import arithmetic
from fineflax.envs.word_problems import generate_problems, make_problem
from fineflax.jobs.resolve import load_config

pytestmark = pytest.mark.fast

SEEDS = (0, 1, 2, 3)
ENV_CONFIGS = {"configs/grpo_arith.py": grpo_arith.PRESETS, "configs/luffy_arith.py": luffy_arith.PRESETS,
               "configs/distill.py": {"": None, "cpu": None}}


def content(problem) -> str:
  """The mathematical content read back from the worked solution's steps ("Step i: a op b = c"), not from
  the key the split uses: the first step's left operand, then each (op, operand)."""
  steps = re.findall(r"Step \d+: (\d+) ([-+*/]) (\d+) = \d+", problem.solution)
  assert len(steps) == problem.num_steps
  return f"{steps[0][0]}:" + ",".join(f"{op}{x}" for _, op, x in steps)


def _task_settings():
  """Distinct task settings over every preset: (config, preset) with the most held-out problems (a smaller
  num_eval takes the first problems of the same list, so it is covered)."""
  out = {}
  for path, presets in ENV_CONFIGS.items():
    for preset in presets:
      t = load_config(f"{path}:{preset}" if preset else path).task
      key = (t.num_train, tuple(t.num_steps), t.max_start, t.max_addend, t.eval_seed,
             tuple(t.get("ood_num_steps", ()) or ()), t.get("ood_template", ""))
      if key not in out or out[key][0] < t.num_eval:
        out[key] = (t.num_eval, path, preset)
  return [v[1:] for v in out.values()]


@pytest.mark.parametrize("path,preset", _task_settings())
def test_no_held_out_problem_has_a_training_twin(path, preset):
  twins, held_out = {}, {}
  for seed in SEEDS:
    config = load_config(f"{path}:{preset}" if preset else path, [f"seed={seed}"])
    env = arithmetic.ArithmeticEnv(config, tokenizer=None)
    t = config.task
    val_task = ml_collections.ConfigDict({**t.to_dict(), "eval_split": "validation"})
    sets = {"test": env.eval_items, **env.extra_eval_sets,
            "validation": arithmetic.held_out(val_task, tuple(t.num_steps),
                                              dict(max_start=t.max_start, max_addend=t.max_addend))}
    train = {content(p) for p in env.train_items}
    assert len(env.train_items) == t.num_train and len(train) == t.num_train  # distinct content
    for name, items in sets.items():
      assert len(items) == t.num_eval, name
      held_out.setdefault(name, set()).update(content(p) for p in items)
      twins[(seed, name)] = sum(content(p) in train for p in items)
  assert not held_out["test"] & held_out["validation"]  # tuning never sees a test problem
  assert twins == {k: 0 for k in twins}


def test_other_arithmetic_jobs_draw_disjoint_content():
  """apo and agent_rl draw their own train / test problems (calculator agent) with the same generator."""
  for path in ("configs/apo.py", "configs/agent_rl.py"):
    t = load_config(path).task
    sizes = dict(max_start=t.max_start, max_addend=t.max_addend)
    for seed in SEEDS:
      train = {content(p) for p in generate_problems(t.num_train + t.get("num_val", 0), "train",
                                                      tuple(t.num_steps), seed, **sizes)}
      test = {content(p) for p in generate_problems(t.get("num_test", t.get("num_eval", 0)), "test",
                                                     tuple(t.num_steps), t.eval_seed, **sizes)}
      assert test and not train & test, path


def test_name_item_and_wording_do_not_decide_the_split():
  ops = [("+", 5), ("-", 3)]
  variants = [make_problem(n, i, 12, ops, tmpl) for n, i, tmpl in
              (("Mia", "apples", "default"), ("Leo", "coins", "default"), ("Ava", "stamps", "box"))]
  assert len({p.question for p in variants}) == 3 and len({(p.split, p.key, p.solution) for p in variants}) == 1
