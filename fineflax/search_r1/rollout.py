"""The Search-R1 multi-turn rollout loop (Jin et al. 2025; `LLMGenerationManager.run_llm_loop`).

For turn = 0 .. max_turns (the last one is the final turn, where searching does nothing):
  every active row generates one turn (until </search>, </answer>, EOS or the turn budget);
  answer -> the row is done;  search -> its query joins ONE batched engine call for the turn and
  "\\n\\n<information>Doc 1(Title: t) …</information>\\n\\n" is appended;  anything else (invalid) ->
  the corrective message is appended.  A failing or timed-out engine call inserts
  "search failed: <error>" instead, and the rollout goes on.
Rows that answered stop; the others continue. A row also stops when its completion (model + inserted
tokens) would pass `max_response_tokens`. Inserted blocks are cut to `max_obs_tokens` tokens.
Loss mask: 1 on tokens the policy generated, 0 on inserted tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from fineflax.sampling import bucket, chat_prompt_ids
from fineflax.search_r1.actions import (SEARCH_R1_PROMPT, Tags, build_prompt, format_passages,
                                        information_text, parse_action)
from fineflax.search_r1.policy import Policy
from fineflax.search_r1.tools import SearchFn


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  max_turns: int = 4  # turns that may search (or be invalid) before the final turn
  max_turn_tokens: int = 128  # new tokens per model turn
  max_response_tokens: int = 512  # completion budget per row: generated + inserted tokens
  max_obs_tokens: int = 256  # inserted block cut to this many tokens (Search-R1 max_obs_length)
  tags: Tags = Tags()
  template: str = SEARCH_R1_PROMPT  # user message; {question} and {info}


@dataclasses.dataclass
class RolloutResult:
  """One row: completion tokens/loss mask/log-probs (aligned), the answer (None if never given), search
  queries in order, model turns taken, text of each model turn, the trace (turns and inserted text in
  order) and why it ended: "answer" | "turns" (final turn gave no answer) | "length"."""
  tokens: list[int] = dataclasses.field(default_factory=list)
  loss_mask: list[float] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  answer: str | None = None
  queries: list[str] = dataclasses.field(default_factory=list)
  num_turns: int = 0
  turn_texts: list[str] = dataclasses.field(default_factory=list)
  trace: str = ""
  finish: str = ""
  num_invalid: int = 0
  num_search_failures: int = 0

  def _add(self, tokens, mask_value, logprobs, text):
    self.tokens += tokens
    self.loss_mask += [mask_value] * len(tokens)
    self.logprobs += logprobs
    self.trace += text


def prompt_ids(tokenizer, question: str, config: RolloutConfig = RolloutConfig()) -> list[int]:
  """Chat-formatted prompt tokens: the user message `config.template` with the question filled in."""
  return chat_prompt_ids(tokenizer, [{"role": "user", "content": build_prompt(question, config.tags,
                                                                             config.template)}])


def session_length(config: RolloutConfig) -> int:
  """KV-cache slots a `SamplerSession` needs for a full rollout: every turn's decode steps (shared by all
  rows) plus every append's block (bucketed as `SamplerSession.append` does)."""
  return ((config.max_turns + 1) * config.max_turn_tokens
          + config.max_turns * bucket(config.max_obs_tokens, minimum=8))


def run_rollouts(policy: Policy, prompts: Sequence[Sequence[int]], search_fn: SearchFn, tokenizer,
                 config: RolloutConfig = RolloutConfig()) -> list[RolloutResult]:
  """Runs the loop of the module docstring over all prompts at once; one RolloutResult per prompt."""
  if config.max_turns < 0 or config.max_turn_tokens < 1 or config.max_response_tokens < 1:
    raise ValueError(f"RolloutConfig needs max_turns >= 0 and positive token budgets, got {config}")
  tags = config.tags
  rows = [RolloutResult() for _ in prompts]
  policy.start(prompts)
  active = list(range(len(prompts)))
  for turn in range(config.max_turns + 1):
    if not active:
      break
    final = turn == config.max_turns
    room = {b: config.max_response_tokens - len(rows[b].tokens) for b in active}
    turns = policy.decode(min(config.max_turn_tokens, max(room.values())), tags.stop_strings)
    if set(turns) != set(active):
      raise RuntimeError(f"policy returned turns for rows {sorted(turns)}, expected {active}")
    searches, inserts = {}, {}
    for b in active:
      row, t = rows[b], turns[b]
      row.num_turns += 1
      text = t.text
      if len(t.tokens) > room[b]:  # the row's completion budget ends inside this turn
        t.tokens, t.logprobs = t.tokens[:room[b]], t.logprobs[:room[b]]
        text = tokenizer.decode(t.tokens, skip_special_tokens=True)
        row.finish = "length"
      row._add(t.tokens, 1.0, list(t.logprobs), text)
      row.turn_texts.append(text)
      if row.finish:
        continue
      action, content = parse_action(text, tags)
      if action == "answer":
        row.answer, row.finish = content, "answer"
      elif final:
        row.finish = "turns"
      elif action == "search":
        searches[b] = content
        row.queries.append(content)
      else:
        row.num_invalid += 1
        inserts[b] = tags.invalid_text
    if searches:
      try:
        results = search_fn(list(searches.values()))
        bodies = [format_passages(p) for p in results]
      except Exception as e:  # reported to the model; the rollout goes on
        bodies = [f"search failed: {type(e).__name__}: {e}"] * len(searches)
        for b in searches:
          rows[b].num_search_failures += 1
      inserts.update((b, information_text(body, tags)) for b, body in zip(searches, bodies))
    appends = {}
    for b in sorted(inserts):
      row, text = rows[b], inserts[b]
      ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
      if len(ids) > config.max_obs_tokens:
        ids = ids[:config.max_obs_tokens]
        text = tokenizer.decode(ids, skip_special_tokens=True)
      if len(row.tokens) + len(ids) >= config.max_response_tokens:
        row.finish = "length"  # no room left to answer after the inserted text
        continue
      row._add(ids, 0.0, [0.0] * len(ids), text)
      appends[b] = ids
    policy.append(appends)
    active = [b for b in active if not rows[b].finish]
  for row in rows:
    row.finish = row.finish or "turns"
  return rows
