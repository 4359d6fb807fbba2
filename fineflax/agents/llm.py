"""OpenAI-style LLM clients for agents: the in-process fineflax sampler and any OpenAI-compatible endpoint.

Every client has the same surface:
  llm.chat(messages, max_tokens=, temperature=, stop=) -> Completion        (chat turns -> one reply)
  llm.complete(prompt, max_tokens=, temperature=, stop=) -> Completion      (text or token ids -> continuation)
  llm.chat.completions.create(messages=..., ...)                             (the `openai` client's call shape)
A `Completion` carries the reply text and, when the backend gives them, the prompt token ids, the response
token ids and their sampling log-probs (log softmax(logits / T) of each sampled token) — what RL needs.
When a tracer is active (`fineflax.agents.tracing`), every call is recorded as an "llm" span.

  LocalLLM     the fineflax sampler (`fineflax.sampling.generate`) on a `fineflax.rl.policy.Policy`; concurrent
               calls from runner threads are queued and sampled together (`Batcher`).
  OpenAILLM    any OpenAI-compatible HTTP endpoint through the `openai` package; token ids come from the
               vLLM-style extension (`return_token_ids`: `prompt_token_ids`, `choices[i].token_ids`) when
               the server supports it, log-probs from the standard `logprobs` field.
  ScriptedLLM  fixed replies (tests, APO mechanics).
"""
from __future__ import annotations

import dataclasses
import time
import types
from typing import Any, Callable, Sequence

from fineflax.agents import tracing


@dataclasses.dataclass
class Completion:
  """One reply. logprobs: sampling log-probs per response token (0 under greedy decoding);
  raw_logprobs: log_softmax(logits)[token] (untempered; None when the backend does not give them)."""
  text: str
  prompt_ids: list[int] = dataclasses.field(default_factory=list)
  response_ids: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  raw_logprobs: list[float] | None = None
  finish_reason: str = "stop"
  model: str = ""

  def openai(self) -> Any:
    """The reply in the shape of an `openai` ChatCompletion (choices[0].message.content, ...)."""
    msg = types.SimpleNamespace(role="assistant", content=self.text)
    choice = types.SimpleNamespace(index=0, message=msg, finish_reason=self.finish_reason,
                                   token_ids=self.response_ids, logprobs=self.logprobs)
    return types.SimpleNamespace(choices=[choice], model=self.model, prompt_token_ids=self.prompt_ids,
                                 fineflax=self)


class _Chat:
  """`llm.chat(messages, ...)` and `llm.chat.completions.create(messages=..., ...)`."""

  def __init__(self, llm):
    self._llm = llm
    self.completions = types.SimpleNamespace(create=self._create)

  def __call__(self, messages, **kw) -> Completion:
    return self._llm._traced("chat", messages, kw)

  def _create(self, *, messages, model=None, max_tokens=None, max_completion_tokens=None, temperature=None,
              stop=None, **_ignored):
    kw = dict(max_tokens=max_tokens or max_completion_tokens, temperature=temperature, stop=stop)
    return self(messages, **kw).openai()


class LLM:
  """Base class: subclasses implement `_chat(messages, **settings)` and `_complete(prompt, **settings)`."""

  name = "llm"

  def __init__(self):
    self.chat = _Chat(self)

  def complete(self, prompt: str | Sequence[int], **kw) -> Completion:
    return self._traced("complete", prompt, kw)

  def _traced(self, kind: str, request, kw) -> Completion:
    kw = {k: v for k, v in kw.items() if v is not None}
    if isinstance(kw.get("stop"), str):
      kw["stop"] = [kw["stop"]]
    t0 = time.time()
    out = self._chat(request, **kw) if kind == "chat" else self._complete(request, **kw)
    tracing.record_llm(kind, self.name, request, kw, out, t0, time.time())
    return out

  def _chat(self, messages, **kw) -> Completion:
    raise NotImplementedError

  def _complete(self, prompt, **kw) -> Completion:
    raise NotImplementedError


class LocalLLM(LLM):
  """The in-process sampler: base + LoRA + sampling settings of `policy` (`fineflax.rl.policy.Policy`).

  A call's `temperature` / `max_tokens` override the policy's (`temperature=0`: greedy). Calls from many
  threads are batched by `Batcher` (calls with equal settings share one `generate`).
  """

  def __init__(self, policy, rng, *, max_batch: int = 64, wait_s: float = 0.01, name: str = "fineflax-local"):
    super().__init__()
    from fineflax.agents.batcher import Batcher
    self.policy, self.name = policy, name
    self.tokenizer = policy.tokenizer
    self.batcher = Batcher(policy, rng, max_batch=max_batch, wait_s=wait_s)

  def prompt_ids(self, messages) -> list[int]:
    from fineflax.sampling import chat_prompt_ids
    return chat_prompt_ids(self.tokenizer, messages)

  def _chat(self, messages, **kw):
    return self._complete(self.prompt_ids(messages), **kw)

  def _complete(self, prompt, max_tokens=None, temperature=None, stop=()):
    ids = (list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"]) if isinstance(prompt, str)
           else [int(t) for t in prompt])
    settings = (int(max_tokens or self.policy.max_new_tokens),
                float(self.policy.temperature if temperature is None else temperature), tuple(stop or ()))
    out = self.batcher.submit(ids, settings)
    return dataclasses.replace(out, model=self.name)

  def close(self):
    self.batcher.close()


class OpenAILLM(LLM):
  """Any OpenAI-compatible endpoint (`base_url` like http://127.0.0.1:8000/v1) via the `openai` package."""

  def __init__(self, base_url: str, model: str, api_key: str = "EMPTY", timeout_s: float = 120.0,
               temperature: float | None = None, max_tokens: int | None = None):
    super().__init__()
    import openai
    self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s)
    self.model, self.name = model, model
    self.defaults = {k: v for k, v in dict(temperature=temperature, max_tokens=max_tokens).items()
                     if v is not None}

  def _chat(self, messages, **kw):
    r = self.client.chat.completions.create(model=self.model, messages=list(messages), logprobs=True,
                                            extra_body={"return_token_ids": True}, **{**self.defaults, **kw})
    c = r.choices[0]
    lps = [t.logprob for t in (c.logprobs.content or [])] if c.logprobs is not None else []
    return Completion(c.message.content or "", _extra(r, "prompt_token_ids"), _extra(c, "token_ids"), lps,
                      None, c.finish_reason or "stop", r.model)

  def _complete(self, prompt, **kw):
    r = self.client.completions.create(model=self.model, prompt=prompt if isinstance(prompt, str) else list(prompt),
                                       logprobs=1, extra_body={"return_token_ids": True},
                                       **{**self.defaults, **kw})
    c = r.choices[0]
    lps = list(c.logprobs.token_logprobs or []) if c.logprobs is not None else []
    prompt_ids = _extra(c, "prompt_token_ids") or _extra(r, "prompt_token_ids") or (
        [] if isinstance(prompt, str) else list(prompt))
    return Completion(c.text or "", prompt_ids, _extra(c, "token_ids"), lps, None, c.finish_reason or "stop",
                      r.model)


def _extra(obj, key) -> list[int]:
  """A non-standard field of an `openai` response object (pydantic `model_extra`), [] when absent."""
  value = getattr(obj, key, None)
  if value is None:
    value = (getattr(obj, "model_extra", None) or {}).get(key)
  return list(value) if value else []


class ScriptedLLM(LLM):
  """Replies `script(request, call_index) -> str` (or script[call_index]); with a tokenizer, token ids too.

  A reply with a stop string is cut right after it (finish "stop"); otherwise `eos_id` (when given) ends it
  (finish "eos"). Log-probs are 0. Thread-safe call counting.
  """

  def __init__(self, script: Callable[[Any, int], str] | Sequence[str], tokenizer=None, eos_id: int | None = None,
               name: str = "scripted"):
    import threading
    super().__init__()
    self.script = script if callable(script) else (lambda request, i: script[i])
    self.tokenizer, self.eos_id, self.name = tokenizer, eos_id, name
    self.calls: list[Any] = []
    self._lock = threading.Lock()

  def _reply(self, request, prompt_ids, stop):
    from fineflax.search_r1.actions import cut_at_stop
    with self._lock:
      i = len(self.calls)
      self.calls.append(request)
    text, stopped = cut_at_stop(self.script(request, i), stop or ())
    ids = [] if self.tokenizer is None else list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
    finish = "stop" if stopped else "eos"
    if not stopped and self.eos_id is not None:
      ids.append(self.eos_id)
    return Completion(text, prompt_ids, ids, [0.0] * len(ids), [0.0] * len(ids), finish, self.name)

  def _chat(self, messages, stop=(), **_):
    prompt_ids = []
    if self.tokenizer is not None:
      from fineflax.sampling import chat_prompt_ids
      prompt_ids = chat_prompt_ids(self.tokenizer, messages)
    return self._reply(messages, prompt_ids, stop)

  def _complete(self, prompt, stop=(), **_):
    ids = list(prompt) if not isinstance(prompt, str) else (
        [] if self.tokenizer is None else list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"]))
    return self._reply(prompt, ids, stop)
