"""Search-R1 outcome reward on a rollout.

  R = w_em * EM + w_format * F + w_search * S
  EM = 1 iff the final <answer> equals a golden answer after SQuAD normalisation (Search-R1 qa_em: 0 when
       the rollout gave no answer);
  F  = 1 iff the rollout ended with an answer and every model turn is `<think>…</think>` followed by one
       <search>q</search> or <answer>a</answer> (`actions.turn_is_well_formed`);
  S  = 1 iff the rollout issued at least one search.
Search-R1's paper reward is EM alone (w_format = w_search = 0). The three parts are registry rewards
(`search_r1_em`, `search_r1_format`, `search_r1_searched`) that read the rollout from the example
{"answer": golden, "rollout": RolloutResult}, so a config weighs them like any other reward.
"""
from __future__ import annotations

from typing import Sequence

from fineflax.rewards.qa import exact_match_score, golden_answers
from fineflax.rewards.registry import register
from fineflax.search_r1.actions import Tags, turn_is_well_formed
from fineflax.search_r1.rollout import RolloutResult


def well_formed(result: RolloutResult, tags: Tags = Tags()) -> float:
  return float(result.finish == "answer" and bool(result.turn_texts)
               and all(turn_is_well_formed(t, tags) for t in result.turn_texts))


def search_r1_reward(result: RolloutResult, golden: Sequence[str], *, em: float = 1.0,
                     format: float = 0.0, search: float = 0.0, tags: Tags = Tags()
                     ) -> tuple[float, dict[str, float]]:
  """(R, {"em", "format", "search"} unweighted parts) of the module formula."""
  parts = {"em": exact_match_score(result.answer, golden), "format": well_formed(result, tags),
           "search": float(len(result.queries) > 0)}
  return em * parts["em"] + format * parts["format"] + search * parts["search"], parts


@register("search_r1_em")
def search_r1_em(prompt: str, completion: str, *, rollout: RolloutResult, **example) -> float:
  """EM of the rollout's final answer (0 when it never answered)."""
  return exact_match_score(rollout.answer, golden_answers(example))


@register("search_r1_format")
def search_r1_format(prompt: str, completion: str, *, rollout: RolloutResult, **example) -> float:
  """1 iff the rollout answered and every model turn is well formed (`well_formed`)."""
  return well_formed(rollout)


@register("search_r1_searched")
def search_r1_searched(prompt: str, completion: str, *, rollout: RolloutResult, **example) -> float:
  """1 iff the rollout issued at least one search."""
  return float(len(rollout.queries) > 0)
