"""OpenAI-style LLM clients for agents: the in-process fineflax sampler and any OpenAI-compatible endpoint.

Every client has the same surface:
  llm.chat(messages, max_tokens=, temperature=, stop=) -> Completion        (chat turns -> one reply)
  llm.complete(prompt, max_tokens=, temperature=, stop=) -> Completion      (text or token ids -> continuation)
  llm.chat.completions.create(messages=..., ...)                             (the `openai` client's call shape)
A `Completion` carries the reply text and, when the backend gives them, the prompt token ids, the response
token ids and their sampling log-probs (log softmax(logits / T) of each sampled token) — what RL needs.
When a tracer is active (`fineflax.agents.tracing`), every call is recorded as an "llm" span.

  LocalLLM     the fineflax engine on a `fineflax.rl.policy.Policy`: concurrent calls from runner threads are
               rows of one continuously batched engine; an agent's next turn resumes its KV pages.
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
  """The in-process engine (`fineflax.engine`) on `policy` (`fineflax.rl.policy.Policy`: base + LoRA +
  sampling settings); a call's `temperature` / `max_tokens` override the policy's (0: greedy).

  Calls from many threads run concurrently: each becomes a sequence of one engine driven by one thread
  (`engine.driver.EngineThread`), admitted as rows free up (continuous batching, `max_rows` at once).
  Call k samples with key fold_in(fold_in(rng, k), 0), as `generate(rng=fold_in(rng, k))` samples its
  prompt alone. A finished sequence keeps its KV pages (up to `keep` of them, least recently used
  released first, and whenever a new call waits for room): a later call whose prompt continues one (its
  prompt + answer, then new tokens: an agent's next turn after a tool's output) appends only the new
  tokens to that sequence and resumes it, instead of prefilling the whole context again (`reused` counts
  them; such a turn draws from the sequence's own key). A call's prompt + max_tokens must fit `context`.
  `batch_sizes`: the rows of each decode call.
  """

  def __init__(self, policy, rng, *, max_rows: int = 64, context: int = 1024, keep: int | None = None,
               page_size: int = 16, chunk_size: int = 32, name: str = "fineflax-local"):
    super().__init__()
    from fineflax.engine.driver import EngineThread, engine_factory
    self.policy, self.rng, self.name = policy, rng, name
    self.tokenizer = policy.tokenizer
    self.context, self.keep = int(context), int(max_rows if keep is None else keep)
    make_engine = engine_factory(policy.base, policy.model_config, max_rows=max_rows, context=self.context,
                                 page_size=page_size, dtype=policy.dtype, dense_base=policy.dense_base,
                                 chunk_size=chunk_size, tokenizer=self.tokenizer, lora=policy.lora,
                                 lora_scale=policy.lora_scale)
    self.driver = EngineThread(make_engine, after_step=self._after_step, on_failure=self._failed, name="llm-engine")
    self.calls, self.reused = 0, 0
    self.batch_sizes: list[int] = []
    self._idle: list = []  # finished sequences holding their pages, least recently used first
    self._seen = (None, 0, 0)
    self.driver.start()

  def prompt_ids(self, messages) -> list[int]:
    from fineflax.sampling import chat_prompt_ids
    return chat_prompt_ids(self.tokenizer, messages)

  def _chat(self, messages, **kw):
    return self._complete(self.prompt_ids(messages), **kw)

  def _complete(self, prompt, max_tokens=None, temperature=None, stop=()):
    import concurrent.futures
    ids = (list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"]) if isinstance(prompt, str)
           else [int(t) for t in prompt])
    max_tokens = int(max_tokens or self.policy.max_new_tokens)
    if len(ids) + max_tokens > self.context:
      raise ValueError(f"a prompt of {len(ids)} tokens + max_tokens={max_tokens} exceeds the LocalLLM's "
                       f"context of {self.context} tokens (LocalLLM(context=...))")
    temperature = float(self.policy.temperature if temperature is None else temperature)
    done = concurrent.futures.Future()
    started = self.driver.call(lambda engine: self._start(engine, ids, max_tokens, temperature,
                                                          tuple(stop or ()), done))
    started.result()  # raises what the engine refused
    return dataclasses.replace(done.result(), model=self.name)

  def close(self):
    self.driver.stop()

  # -- engine thread -----------------------------------------------------------------------------
  def _start(self, engine, ids, max_tokens, temperature, stop, done):
    import jax
    from fineflax.engine import Request
    seq = self._continued(ids, max_tokens, temperature)
    if seq is not None:
      self._idle.remove(seq)
      engine.append(seq, ids[len(seq.full):])  # fed as tool output: tokens after them are the answer
      start = len(seq.tokens)
      engine.resume(seq, max_tokens, stop)
      self.reused += 1
    else:
      key = jax.random.fold_in(jax.random.fold_in(self.rng, self.calls), 0)
      self.calls += 1
      seq = engine.submit(Request(ids, max_new_tokens=max_tokens, temperature=temperature, top_p=self.policy.top_p,
                                  key=key, stop_strings=stop, hold=True, reserve=self.context - len(ids)))
      start = 0
    seq.request.on_update = lambda s: self._update(s, ids, start, done)

  def _continued(self, ids, max_tokens, temperature):
    """The idle sequence whose prompt + answer `ids` extends by at least one token (the longest), with
    this call's settings and room for it; None if there is none."""
    best = None
    for s in self._idle:
      n = len(s.full)
      if (n < len(ids) and ids[:n] == s.full and s.request.temperature == temperature
          and len(ids) - n + max_tokens <= s.room and (best is None or n > len(best.full))):
        best = s
    return best

  def _update(self, seq, prompt, start, done):
    if not seq.finished:
      return
    if seq.status == "cancelled":
      done.set_exception(RuntimeError("the engine cancelled this call"))
      return
    tokens = seq.tokens[start:]
    text = self.tokenizer.decode(tokens, skip_special_tokens=True)
    text = text[:len(text) - seq.excess_chars]
    done.set_result(Completion(text, list(prompt), list(tokens), list(seq.logprobs[start:]),
                               list(seq.raw_logprobs[start:]), seq.status))
    self._idle.append(seq)

  def _after_step(self, engine):
    """Releases idle sequences beyond `keep`, and one more while a call waits for a row or pages."""
    while self._idle and (len(self._idle) > self.keep or engine.waiting):
      engine.release(self._idle.pop(0))
      if len(self._idle) <= self.keep:
        break
    seen_engine, calls, rows = self._seen
    if seen_engine is not engine:
      calls = rows = 0
    if engine.stats["decode_calls"] > calls:
      self.batch_sizes.append(engine.stats["decode_rows"] - rows)
    self._seen = (engine, engine.stats["decode_calls"], engine.stats["decode_rows"])

  def _failed(self, engine, e):
    """A failed device call: every call in the old engine fails with it."""
    self._idle = []
    for seq in engine.live + [s for g in engine.waiting for s in g]:
      update = seq.request.on_update
      if update is not None:
        seq.status = "cancelled"
        update(seq)


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
