"""Thin adapter: an agent written for Agent Lightning (`@agentlightning.rollout` function or `LitAgent` subclass)
as one of ours, `(task, llm, resources) -> reward`, run by our runner and traced into our store.

Agent Lightning agents reach the model over HTTP (`agl.LLM(endpoint=..., model=...)` + their own OpenAI
client). The adapter gives each rollout an `LLMProxy` route bound to its tracer and the runner's `llm`, wraps
string resources as `agl.PromptTemplate(engine="f-string")`, and calls `agent.rollout(task, resources, rollout)`.
Only the agent's return value is its reward (`agl.emit_reward` goes to Agent Lightning's own tracer).
"""
from __future__ import annotations

import types

from fineflax.agents.proxy import LLMProxy
from fineflax.agents.tracing import current


def from_agentlightning(agent, proxy: LLMProxy, *, llm_resource: str = "main_llm", sampling_parameters=None):
  import agentlightning as agl
  if not hasattr(agent, "rollout"):
    raise TypeError(f"{agent!r} is not an Agent Lightning agent (decorate it with @agentlightning.rollout "
                    "or subclass agentlightning.LitAgent)")

  def run(task, llm, resources):
    tracer = current()
    url = proxy.endpoint(tracer, llm)
    try:
      res = {llm_resource: agl.LLM(endpoint=url, model=getattr(llm, "name", "local"),
                                   sampling_parameters=dict(sampling_parameters or {}))}
      for name, value in resources.items():
        res[name] = agl.PromptTemplate(template=value, engine="f-string") if isinstance(value, str) else value
      rollout = types.SimpleNamespace(rollout_id=getattr(tracer, "rollout_id", ""),
                                      attempt=types.SimpleNamespace(attempt_id=getattr(tracer, "attempt_id", "")))
      return agent.rollout(task, res, rollout)
    finally:
      proxy.release(url)

  return run
