"""Spans of an agent run: every LLM call, tool call and reward, recorded as it happens.

A span is (rollout_id, attempt_id, seq, kind, name, start, end, attributes):
  kind "llm"     attributes: request (messages or prompt), settings, text, prompt_ids, response_ids,
                 logprobs (sampling log-probs of response_ids), raw_logprobs, finish_reason, model
  kind "tool"    attributes: args, result or error
  kind "reward"  attributes: value, final (bool)
The runner activates a `Tracer` for each attempt (a context variable, so each runner thread has its own);
`LLM` clients, `tool`-wrapped functions and `emit_reward` record into it, and its sink (the store) makes
each span durable before the call returns. Outside a tracer nothing is recorded.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import threading
import time
from typing import Any, Callable

_CURRENT: contextvars.ContextVar = contextvars.ContextVar("fineflax_agent_tracer", default=None)


@dataclasses.dataclass
class Span:
  rollout_id: str
  attempt_id: str
  seq: int
  kind: str
  name: str
  start: float
  end: float
  attributes: dict


class Tracer:
  """Collects one attempt's spans in order and hands each to `sink` (e.g. `Store.add_span`) at once."""

  def __init__(self, rollout_id: str = "", attempt_id: str = "", sink: Callable[[Span], None] | None = None):
    self.rollout_id, self.attempt_id, self.sink = rollout_id, attempt_id, sink
    self.spans: list[Span] = []
    self._lock = threading.Lock()

  def record(self, kind: str, name: str, attributes: dict, start: float, end: float | None = None) -> Span:
    with self._lock:
      span = Span(self.rollout_id, self.attempt_id, len(self.spans), kind, name, start,
                  time.time() if end is None else end, attributes)
      self.spans.append(span)
      if self.sink is not None:
        self.sink(span)
    return span


@contextlib.contextmanager
def tracing(tracer: Tracer):
  """Makes `tracer` the active one in this context (thread) for the block."""
  token = _CURRENT.set(tracer)
  try:
    yield tracer
  finally:
    _CURRENT.reset(token)


def current() -> Tracer | None:
  return _CURRENT.get()


def record_llm(kind: str, model: str, request, settings: dict, out, start: float, end: float) -> None:
  """An "llm" span of one client call (no-op without an active tracer)."""
  tracer = current()
  if tracer is None:
    return
  req = request if isinstance(request, str) else _jsonable([dict(m) if isinstance(m, dict) else
                                                            int(m) if hasattr(m, "__index__") else m for m in request])
  tracer.record("llm", model, {
      "call": kind, "request": req, "settings": {k: list(v) if isinstance(v, tuple) else v
                                                 for k, v in settings.items()},
      "text": out.text, "prompt_ids": list(out.prompt_ids), "response_ids": list(out.response_ids),
      "logprobs": list(out.logprobs), "raw_logprobs": None if out.raw_logprobs is None else list(out.raw_logprobs),
      "finish_reason": out.finish_reason, "model": out.model}, start, end)


def emit_reward(value: float, name: str = "reward", final: bool = False) -> None:
  """Records a reward span: intermediate (after the latest LLM call) or the rollout's final reward."""
  tracer = current()
  if tracer is not None:
    tracer.record("reward", name, {"value": float(value), "final": bool(final)}, time.time())


def tool(fn: Callable | None = None, *, name: str | None = None):
  """Decorator: each call of the tool is a "tool" span with its arguments and result (or error)."""
  if fn is None:
    return functools.partial(tool, name=name)

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    tracer, t0 = current(), time.time()
    try:
      result = fn(*args, **kwargs)
    except Exception as e:
      if tracer is not None:
        tracer.record("tool", name or fn.__name__, {"args": _jsonable([args, kwargs]),
                                                    "error": f"{type(e).__name__}: {e}"}, t0)
      raise
    if tracer is not None:
      tracer.record("tool", name or fn.__name__, {"args": _jsonable([args, kwargs]), "result": _jsonable(result)}, t0)
    return result

  return wrapped


def _jsonable(x: Any):
  import json
  try:
    return json.loads(json.dumps(x))  # tuples become lists, as the store returns them
  except (TypeError, ValueError):
    return repr(x)
