"""Runners: execute an agent over many tasks concurrently (threads), one traced attempt at a time per rollout.

An agent is `agent(task, llm, resources) -> reward` (a function, or an object with that `rollout` method).
For each task the runner creates a rollout in the store, then up to `max_attempts` attempts: each runs the
agent under a fresh `Tracer` whose spans go straight to the store; an exception fails the attempt (error
recorded) and the next attempt starts. The reward of a rollout is the agent's return value; when it returns
None, the last final reward span (`emit_reward(..., final=True)`), else the sum of its reward spans. The
returned reward is also recorded as a final "reward" span.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import traceback
from typing import Any, Callable, Sequence

from fineflax.agents.store import Store
from fineflax.agents.tracing import Span, Tracer, tracing


@dataclasses.dataclass
class RolloutRecord:
  """A finished rollout: its spans are those of the last attempt; reward None when every attempt failed."""
  rollout_id: str
  task: Any
  group_id: str
  reward: float | None
  status: str
  attempts: int
  spans: list[Span]
  error: str | None = None


def agent_callable(agent) -> Callable:
  if hasattr(agent, "rollout"):
    return agent.rollout
  if callable(agent):
    return agent
  raise TypeError(f"agent {agent!r}: need a function (task, llm, resources) -> reward or an object with .rollout")


def resolve_reward(returned, spans: Sequence[Span]) -> float:
  if returned is not None:
    return float(returned)
  rewards = [s for s in spans if s.kind == "reward"]
  final = [s for s in rewards if s.attributes["final"]]
  if final:
    return float(final[-1].attributes["value"])
  return float(sum(s.attributes["value"] for s in rewards))


def run_one(agent, task, llm, resources, store: Store, *, mode: str = "train", group_id: str = "",
            max_attempts: int = 1) -> RolloutRecord:
  fn = agent_callable(agent)
  rid = store.add_rollout(task, mode, group_id)
  error = None
  for n in range(1, max_attempts + 1):
    aid, _ = store.start_attempt(rid)
    tracer = Tracer(rid, aid, sink=store.add_span)
    try:
      with tracing(tracer):
        returned = fn(task, llm, resources)
        reward = resolve_reward(returned, tracer.spans)
        if returned is not None:
          tracer.record("reward", "final", {"value": reward, "final": True}, tracer.spans[-1].end if tracer.spans else 0.0)
    except Exception as e:
      error = f"{type(e).__name__}: {e}"
      store.finish_attempt(aid, "failed", traceback.format_exc(limit=4))
      continue
    store.finish_attempt(aid, "succeeded")
    store.finish_rollout(rid, "succeeded", reward)
    return RolloutRecord(rid, task, group_id, reward, "succeeded", n, tracer.spans)
  store.finish_rollout(rid, "failed", None)
  return RolloutRecord(rid, task, group_id, None, "failed", max_attempts, tracer.spans, error)


def run_rollouts(agent, tasks: Sequence[Any], llm, resources: dict | None, store: Store, *,
                 num_workers: int = 8, max_attempts: int = 1, mode: str = "train",
                 group_ids: Sequence[str] | None = None) -> list[RolloutRecord]:
  """One `RolloutRecord` per task (same order), run by `num_workers` threads sharing `llm` (a `LocalLLM`
  batches their calls). group_ids[i] groups rollouts of the same task for group advantages."""
  resources = dict(resources or {})
  group_ids = list(group_ids) if group_ids is not None else [""] * len(tasks)
  if num_workers <= 1:
    return [run_one(agent, t, llm, resources, store, mode=mode, group_id=g, max_attempts=max_attempts)
            for t, g in zip(tasks, group_ids)]
  with concurrent.futures.ThreadPoolExecutor(num_workers, thread_name_prefix="rollout") as pool:
    futures = [pool.submit(run_one, agent, t, llm, resources, store, mode=mode, group_id=g,
                           max_attempts=max_attempts) for t, g in zip(tasks, group_ids)]
    return [f.result() for f in futures]
