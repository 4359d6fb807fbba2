"""Search-R1 outcome reward on a rollout.

  R = w_em * EM + w_format * F + w_search * S
  EM = 1 iff the final <answer> equals a golden answer after SQuAD normalisation (Search-R1 qa_em: 0 when
       the rollout gave no answer);
  F  = 1 iff the rollout ended with an answer and every model turn is `<think>…</think>` followed by one
       <search>q</search> or <answer>a</answer> (`actions.turn_is_well_formed`);
  S  = 1 iff the rollout issued at least one search.
Search-R1's paper reward is EM alone (w_format = w_search = 0).
"""
from __future__ import annotations

from typing import Sequence

from fineflax.rewards.qa import normalize_answer
from fineflax.search_r1.actions import Tags, turn_is_well_formed
from fineflax.search_r1.rollout import RolloutResult


def exact_match(answer: str | None, golden: Sequence[str]) -> float:
  if isinstance(golden, str):
    golden = [golden]
  if answer is None:
    return 0.0
  guess = normalize_answer(answer)
  return float(any(guess == normalize_answer(g) for g in golden))


def well_formed(result: RolloutResult, tags: Tags = Tags()) -> float:
  return float(result.finish == "answer" and bool(result.turn_texts)
               and all(turn_is_well_formed(t, tags) for t in result.turn_texts))


def search_r1_reward(result: RolloutResult, golden: Sequence[str], *, em: float = 1.0,
                     format: float = 0.0, search: float = 0.0, tags: Tags = Tags()
                     ) -> tuple[float, dict[str, float]]:
  """(R, {"em", "format", "search"} unweighted parts) of the module formula."""
  parts = {"em": exact_match(result.answer, golden), "format": well_formed(result, tags),
           "search": float(len(result.queries) > 0)}
  return em * parts["em"] + format * parts["format"] + search * parts["search"], parts
