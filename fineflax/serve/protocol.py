"""OpenAI chat-completions wire format: request validation and response / chunk objects.

Extensions: `ignore_eos: true` decodes through EOS up to max_tokens (for benchmarks, as vLLM's);
`category: str` (1-64 characters) names the request's category for contextual routing of model="auto"
(and the per-category statistics); without it the server's classifier, if any, gives one.

A bad field raises `ApiError(status, message, param)`, answered as
{"error": {"message", "type", "param", "code"}} with that HTTP status; type is OpenAI's:
"authentication_error" for 401, "server_error" for 5xx, "invalid_request_error" for any other 4xx.
"""
from __future__ import annotations

import dataclasses
import math
import time

from fineflax.engine.keys import SEED_RANGE


class ApiError(Exception):
  """An HTTP error answer; headers: extra response headers (Retry-After of a 429 / 503)."""

  def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
               headers: dict | None = None):
    super().__init__(message)
    self.status, self.message, self.param, self.code = status, message, param, code
    self.headers = dict(headers or {})

  def body(self) -> dict:
    kind = ("authentication_error" if self.status == 401 else "server_error" if self.status >= 500
            else "invalid_request_error")
    return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass
class ChatRequest:
  model: str
  messages: list
  temperature: float = 1.0
  top_p: float = 1.0
  max_tokens: int | None = None
  stop: tuple = ()
  n: int = 1
  seed: int | None = None
  stream: bool = False
  include_usage: bool = False
  logprobs: bool = False
  ignore_eos: bool = False
  category: str | None = None


def _number(body, key, default, lo, hi, lo_open=False):
  v = body.get(key)
  if v is None:
    return default
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
    raise ApiError(400, f"{key}={v!r}: expected a number", key)
  if v < lo or v > hi or (lo_open and v == lo):
    raise ApiError(400, f"{key}={v!r}: must be in {'(' if lo_open else '['}{lo}, {hi}]", key)
  return float(v)


def _int(body, key, default, lo, hi):
  v = body.get(key)
  if v is None:
    return default
  if isinstance(v, bool) or not isinstance(v, int):
    raise ApiError(400, f"{key}={v!r}: expected an integer", key)
  if not lo <= v <= hi:
    raise ApiError(400, f"{key}={v}: must be in [{lo}, {hi}]", key)
  return v


def _flag(body, key, name=None):
  """A boolean field (absent or null: False); any other type is a 400 ("yes" is not true)."""
  v = body.get(key)
  if v is None:
    return False
  if not isinstance(v, bool):
    raise ApiError(400, f"{name or key}={v!r}: expected true or false", name or key)
  return v


def _content(i, m):
  c = m.get("content")
  if isinstance(c, str):
    return c
  if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                 isinstance(p.get("text"), str) for p in c):
    return "".join(p["text"] for p in c)
  if c is None and m.get("role") == "assistant":
    return ""
  raise ApiError(400, f"messages[{i}].content: expected a string or a list of text parts", "messages")


def parse_chat_request(body, *, max_tokens_limit: int, max_n: int) -> ChatRequest:
  """A validated `ChatRequest` from the parsed JSON body (see module docstring for errors)."""
  if not isinstance(body, dict):
    raise ApiError(400, f"request body: expected a JSON object, got {type(body).__name__}")
  model = body.get("model")
  if not isinstance(model, str) or not model:
    raise ApiError(400, f"model={model!r}: expected a model name (GET /v1/models lists them)", "model")
  msgs = body.get("messages")
  if not isinstance(msgs, list) or not msgs:
    raise ApiError(400, "messages: expected a non-empty list of {role, content}", "messages")
  messages = []
  for i, m in enumerate(msgs):
    if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
      raise ApiError(400, f"messages[{i}]: expected {{role: system|user|assistant|tool, content}}",
                     "messages")
    role = "system" if m["role"] == "developer" else m["role"]
    messages.append({"role": role, "content": _content(i, m)})
  stop = body.get("stop")
  if stop is None:
    stop = ()
  elif isinstance(stop, str):
    stop = (stop,)
  elif isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
    stop = tuple(stop)
  else:
    raise ApiError(400, f"stop={stop!r}: expected a string or a list of at most 4 strings", "stop")
  if "" in stop:
    raise ApiError(400, f"stop={body.get('stop')!r}: a stop string must not be empty", "stop")
  max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
  if max_tokens is not None:
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = _int({key: max_tokens}, key, None, 1, max_tokens_limit)
  seed = body.get("seed")
  if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
    raise ApiError(400, f"seed={seed!r}: expected an integer", "seed")
  if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
    raise ApiError(400, f"seed={seed}: must be in [-2**63, 2**64 - 1] (all 64 bits are used)", "seed")
  top_logprobs = body.get("top_logprobs")
  if top_logprobs not in (None, 0):
    raise ApiError(400, f"top_logprobs={top_logprobs!r}: not supported (only the sampled token's logprob)",
                   "top_logprobs")
  category = body.get("category")
  if category is not None and (not isinstance(category, str) or not 1 <= len(category) <= 64):
    raise ApiError(400, f"category={category!r:.80}: expected a string of 1-64 characters", "category")
  opts = body.get("stream_options") or {}
  if not isinstance(opts, dict):
    raise ApiError(400, f"stream_options={opts!r}: expected an object", "stream_options")
  return ChatRequest(
      model=model, messages=messages, temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
      top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True), max_tokens=max_tokens, stop=stop,
      n=_int(body, "n", 1, 1, max_n), seed=seed, stream=_flag(body, "stream"),
      include_usage=_flag(opts, "include_usage", "stream_options.include_usage"), logprobs=_flag(body, "logprobs"),
      ignore_eos=_flag(body, "ignore_eos"), category=category)


def logprob_content(entries, token_bytes) -> list[dict]:
  """OpenAI `logprobs.content` items from (token id, logprob) pairs (top_logprobs left empty). bytes: the
  token's own bytes (`token_bytes`, `engine.detok.token_bytes`: a choice's joined bytes are its text's UTF-8,
  a character split over tokens included); token: those bytes as text (U+FFFD for a partial character)."""
  out = []
  for tok, lp in entries:
    raw = token_bytes(tok)
    out.append({"token": raw.decode("utf-8", errors="replace"), "logprob": float(lp), "bytes": list(raw),
                "top_logprobs": []})
  return out


def completion(rid, model, created, choices, usage) -> dict:
  return {"id": rid, "object": "chat.completion", "created": created, "model": model,
          "system_fingerprint": None, "choices": choices, "usage": usage}


def chunk(rid, model, created, choices, usage=None) -> dict:
  out = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
         "system_fingerprint": None, "choices": choices}
  if usage is not None:
    out["usage"] = usage
  return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
  return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
          "total_tokens": prompt_tokens + completion_tokens}


def now() -> int:
  return int(time.time())
