"""Eval set loading and the A/B run: both variants answer, task metrics per example, the judge in both orders.

Eval rows (JSONL or JSON list), each one of
  {"messages": [...]}                   the prompt is every message before the last assistant turn, whose
                                        content is the reference answer (no assistant turn: no reference)
  {"prompt": str | messages, "completion"?: str}
  {"question": str, "answer"?: str}     (the `from_feedback --holdout-out` and arithmetic eval files)
Other fields of the row go to the reward functions as the example (`answer` is set to the reference when
the row has none). Metrics: `exact_match_lenient` (the <answer> if any, else the whole reply; when references exist) and any registry rewards named in
`rewards`; per metric the mean of A and of B and the bootstrap CI of the paired difference A - B.
"""
from __future__ import annotations

import json
import pathlib
from typing import Sequence

from fineflax.evals import judge as judge_lib
from fineflax.stats import mean_ci, outcome_ci
from fineflax.io import JsonLineError, json_lines


class EvalDataError(ValueError):
  """A row of the eval set that has no usable prompt; the message names the file and line."""


def parse_row(row: dict, where: str) -> dict:
  """{"prompt": messages, "reference": str | None, "example": dict}."""
  if not isinstance(row, dict):
    raise EvalDataError(f"{where}: expected an object, got {type(row).__name__}")
  if "messages" in row:
    msgs = row["messages"]
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m for m in msgs):
      raise EvalDataError(f"{where}: field 'messages' must be a non-empty list of {{role, content}} objects")
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
    prompt, reference = (msgs[:last], msgs[last].get("content")) if last is not None else (msgs, None)
  elif "prompt" in row:
    p = row["prompt"]
    prompt = [{"role": "user", "content": p}] if isinstance(p, str) else p
    reference = row.get("completion") if isinstance(row.get("completion"), str) else row.get("answer")
  elif "question" in row:
    prompt, reference = [{"role": "user", "content": str(row["question"])}], row.get("answer")
  else:
    raise EvalDataError(f"{where}: no 'messages', 'prompt' or 'question' field (fields: {sorted(row)})")
  if not prompt or not isinstance(prompt, list):
    raise EvalDataError(f"{where}: empty prompt")
  example = {k: v for k, v in row.items() if k not in ("messages", "prompt")}
  if reference is not None:
    reference = str(reference)
    example.setdefault("answer", reference)
  return {"prompt": prompt, "reference": reference, "example": example}


def load_eval_set(path, limit: int | None = None) -> list[dict]:
  path = pathlib.Path(path)
  if not path.is_file():
    raise EvalDataError(f"{path}: no such eval file")
  text = path.read_text(encoding="utf-8")
  rows = []
  if text.lstrip().startswith("["):
    try:
      data = json.loads(text)
    except json.JSONDecodeError as e:
      raise EvalDataError(f"{path}: invalid JSON ({e})") from None
    rows = [parse_row(r, f"{path}:row {i}") for i, r in enumerate(data)]
  else:
    try:
      rows = [parse_row(row, f"{path}:line {n}") for n, row in json_lines(path)]
    except JsonLineError as e:
      raise EvalDataError(str(e)) from None
  if not rows:
    raise EvalDataError(f"{path}: no rows")
  return rows[:limit] if limit else rows


def score(metric: str, rows: Sequence[dict], answers: Sequence[str]) -> list[float]:
  from fineflax.rewards.registry import score_completions
  prompts = [judge_lib.render_conversation(r["prompt"]) for r in rows]
  _, per_fn, _ = score_completions({metric: 1.0}, prompts, list(answers), [r["example"] for r in rows])
  return per_fn[metric].astype(float).tolist()


def run_ab(rows: Sequence[dict], variant_a, variant_b, *, judge=None, rewards: Sequence[str] = (),
           num_resamples: int = 10_000, seed: int = 0) -> dict:
  """Answers of both variants, per-example metrics, judge outcomes and the summary (see module docstring)."""
  prompts = [r["prompt"] for r in rows]
  answers_a, answers_b = variant_a(prompts), variant_b(prompts)
  metrics = list(dict.fromkeys((["exact_match_lenient"] if all(r["reference"] is not None for r in rows) else [])
                               + list(rewards)))
  per_example = [{"prompt": r["prompt"], "reference": r["reference"], "a": a, "b": b}
                 for r, a, b in zip(rows, answers_a, answers_b)]
  summary = {"n": len(rows), "metrics": {}}
  for m in metrics:
    sa, sb = score(m, rows, answers_a), score(m, rows, answers_b)
    for ex, x, y in zip(per_example, sa, sb):
      ex.setdefault("metrics", {})[m] = {"a": x, "b": y}
    summary["metrics"][m] = {"a": mean_ci(sa, num_resamples, seed), "b": mean_ci(sb, num_resamples, seed),
                             "a_minus_b": mean_ci([x - y for x, y in zip(sa, sb)], num_resamples, seed)}
  if judge is not None:
    outcomes = []
    for r, ex in zip(rows, per_example):
      j = judge_lib.judge_pair(judge, r["prompt"], ex["a"], ex["b"], r["reference"])
      ex["judge"] = j
      outcomes.append(j["outcome"])
    summary["judge"] = outcome_ci(outcomes, num_resamples, seed)
    summary["judge"]["invalid_verdicts"] = sum(v == "invalid" for ex in per_example
                                               for v in ex["judge"]["verdicts"])
    summary["judge"]["order_disagreements"] = sum(ex["judge"]["votes"][0] * ex["judge"]["votes"][1] < 0
                                                  for ex in per_example)
  return {"summary": summary, "examples": per_example}


def run_many(rows: Sequence[dict], variants: dict, *, judge=None, rewards: Sequence[str] = (),
             num_resamples: int = 10_000, seed: int = 0) -> dict:
  """Several variants ({name: Variant}, the first is the baseline): each answers once; per variant the
  mean and bootstrap CI of each metric; with a judge, each other variant against the baseline in both
  orders (`judge_pair`: +1 the variant wins). {"summary": {"n", "baseline", "variants": {name: {"metrics",
  "judge"?}}}, "examples"}."""
  prompts = [r["prompt"] for r in rows]
  names = list(variants)
  answers = {name: variants[name](prompts) for name in names}
  metrics = list(dict.fromkeys((["exact_match_lenient"] if all(r["reference"] is not None for r in rows) else [])
                               + list(rewards)))
  examples = [{"prompt": r["prompt"], "reference": r["reference"], "answers": {n: answers[n][i] for n in names}}
              for i, r in enumerate(rows)]
  summary = {"n": len(rows), "baseline": names[0], "variants": {n: {"metrics": {}} for n in names}}
  for m in metrics:
    for n in names:
      values = score(m, rows, answers[n])
      for ex, v in zip(examples, values):
        ex.setdefault("metrics", {}).setdefault(m, {})[n] = v
      summary["variants"][n]["metrics"][m] = mean_ci(values, num_resamples, seed)
  if judge is not None:
    for n in names[1:]:
      outcomes = []
      for r, ex in zip(rows, examples):
        j = judge_lib.judge_pair(judge, r["prompt"], ex["answers"][n], ex["answers"][names[0]], r["reference"])
        ex.setdefault("judge", {})[n] = j
        outcomes.append(j["outcome"])
      summary["variants"][n]["judge_vs_baseline"] = outcome_ci(outcomes, num_resamples, seed)
  return {"summary": summary, "examples": examples}
