"""Spans -> RL transitions: one per LLM call (state = its prompt ids, action = its response ids), rewards by
credit assignment, advantages grouped per task, and the padded batch of `fineflax.rl.update.rl_update`.

Credit assignment over the calls i = 0..n-1 of a rollout with final reward R:
  "final"       r_i = R for every call (Agent Lightning's default: the trajectory's reward on each triplet)
  "discounted"  r_i = sum over reward events e at or after call i of gamma^(k_e - i) * v_e, where k_e is the
                index of the last call before the event; the final reward is an event after the last call,
                so without intermediate rewards r_i = gamma^(n-1-i) * R.
Group advantages: the transitions of all rollouts of one task form a group (as verl groups Agent Lightning's
triplets by the task's uid): `fineflax.rl.advantages.group_advantages(rewards, group_ids, scale)`, where a
group whose rewards are all equal, or of one transition, gets 0.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from fineflax.rl.batch import build_rl_batch, pad_ragged

CREDITS = ("final", "discounted")


@dataclasses.dataclass
class Transition:
  rollout_id: str
  group_id: str
  index: int  # call index within the rollout
  prompt_ids: list[int]
  response_ids: list[int]
  logprobs: list[float]  # sampling log-probs of response_ids
  reward: float  # after credit assignment
  final_reward: float
  loss_mask: list[float] | None = None  # None = every response token (merged rows: 0 on inserted text)


def credit(n: int, final: float, events: Sequence[tuple[int, float]] = (), scheme: str = "final",
           gamma: float = 1.0) -> list[float]:
  """Rewards of n calls (module docstring). events: (index of the last call before the reward, value)
  of intermediate rewards; the final reward is added as the event (n - 1, final)."""
  if scheme not in CREDITS:
    raise ValueError(f"credit scheme {scheme!r}: choose one of {', '.join(CREDITS)}")
  if scheme == "final":
    return [float(final)] * n
  out = [0.0] * n
  for k, v in list(events) + [(n - 1, final)]:
    for i in range(k + 1):  # calls 0..k precede the event
      out[i] += gamma ** (k - i) * v
  return out


def rollout_transitions(record, scheme: str = "final", gamma: float = 1.0) -> list[Transition]:
  """The transitions of one `RolloutRecord` (its LLM spans in order) with credited rewards."""
  if record.reward is None:
    return []
  calls, events = [], []
  for s in record.spans:
    if s.kind == "llm":
      calls.append(s)
    elif s.kind == "reward" and not s.attributes["final"]:
      events.append((len(calls) - 1, s.attributes["value"]))
  for s in calls:
    if not s.attributes["response_ids"] or not s.attributes["prompt_ids"]:
      raise ValueError(f"rollout {record.rollout_id}: LLM span {s.seq} has no token ids (the endpoint must "
                       "return prompt/response token ids, e.g. vLLM's return_token_ids, for RL)")
  rewards = credit(len(calls), record.reward, [e for e in events if e[0] >= 0], scheme, gamma)
  return [Transition(record.rollout_id, record.group_id, i, list(s.attributes["prompt_ids"]),
                     list(s.attributes["response_ids"]), list(s.attributes["logprobs"]), r, record.reward)
          for i, (s, r) in enumerate(zip(calls, rewards))]


def merge_transitions(ts: Sequence[Transition]) -> Transition:
  """One row for a rollout whose every call continues the previous one (prompt_{i+1} starts with prompt_i +
  response_i): completion = responses and the inserted tokens between them (loss mask 0 there); the
  reward is the first call's. Raises ValueError when a prompt does not extend the previous context."""
  first = ts[0]
  context = list(first.prompt_ids)
  comp, mask, lps = [], [], []
  for t in ts:
    if t.prompt_ids[:len(context)] != context:
      raise ValueError(f"rollout {t.rollout_id}: call {t.index} does not continue the previous context")
    inserted = t.prompt_ids[len(context):]
    comp += inserted + t.response_ids
    mask += [0.0] * len(inserted) + [1.0] * len(t.response_ids)
    lps += [0.0] * len(inserted) + list(t.logprobs)
    context = list(t.prompt_ids) + list(t.response_ids)
  return Transition(first.rollout_id, first.group_id, 0, list(first.prompt_ids), comp, lps, first.reward,
                    first.final_reward, mask)


def transition_batch(ts: Sequence[Transition], advantages, *, pad_id: int) -> dict:
  """The batch of `fineflax.rl.step` (without old/ref log-probs): prompts left-padded, responses right-padded,
  widths rounded to 32; rollout_logp holds the sampling log-probs (for the sampler/trainer mismatch metric)."""
  batch = build_rl_batch([t.prompt_ids for t in ts], [t.response_ids for t in ts],
                         [t.loss_mask if t.loss_mask is not None else [1.0] * len(t.response_ids) for t in ts],
                         pad_id=pad_id)
  batch["advantages"] = np.asarray(advantages, np.float32)
  batch["is_off_policy"] = np.zeros(len(ts), bool)
  batch["rollout_logp"] = pad_ragged([t.logprobs for t in ts], batch["completion"].shape[1])
  return batch
