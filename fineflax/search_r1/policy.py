"""Policies that drive a Search-R1 rollout: the sampler-backed one, one over any LLM client with token-level
`complete` (`fineflax.agents.llm`, the server's engine) and a scripted one (tests, demonstrations).

Interface (`Policy`), over a fixed batch of rows:
  start(prompts)                      prompts: token lists; every row becomes ready
  decode(max_new_tokens, stop_strings) -> {row: Turn}   one turn for every ready row; rows then wait
  append({row: token_ids})            tool text after the row's turn (not generated); the row becomes ready
A turn ends at EOS ("eos"), at the first stop string ("stop"; text cut right after it) or after
max_new_tokens tokens ("length").
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from fineflax.sampling import SamplerSession
from fineflax.search_r1.actions import cut_at_stop


@dataclasses.dataclass
class Turn:
  """One generated turn: tokens the policy produced, their log-probs (untempered policy; 0 when scripted),
  the decoded text (cut after the stop string) and why it ended."""
  tokens: list[int]
  logprobs: list[float]
  text: str
  finish: str


class Policy(Protocol):
  def start(self, prompts: Sequence[Sequence[int]]) -> None: ...
  def decode(self, max_new_tokens: int, stop_strings: Sequence[str]) -> dict[int, Turn]: ...
  def append(self, tokens: Mapping[int, Sequence[int]]) -> None: ...


class SamplerPolicy:
  """A `SamplerSession` (KV cache kept across turns; appended text is fed, not recomputed) as a Policy.

  Session keyword arguments (temperature, top_p, rng, lora, lora_scale, dtype, chunk_size, ...) pass through.
  """

  def __init__(self, params, config, tokenizer, *, max_total_len: int, **session_kwargs):
    self.tokenizer = tokenizer
    self.session = SamplerSession(params, config, max_total_len=max_total_len, tokenizer=tokenizer,
                                  **session_kwargs)
    self._ready: set[int] = set()
    self._lengths = np.zeros(0, np.int64)

  def start(self, prompts):
    self.session.start(prompts)
    self._ready = set(range(len(prompts)))
    self._lengths = np.zeros(len(prompts), np.int64)

  def decode(self, max_new_tokens, stop_strings):
    if not self._ready:
      return {}
    self.session.decode(max_new_tokens, stop_strings)
    out = self.session.result()
    turns = {}
    for b in sorted(self._ready):
      lo, hi = int(self._lengths[b]), int(out.lengths[b])
      tokens = out.tokens[b, lo:hi].tolist()
      text, _ = cut_at_stop(self.tokenizer.decode(tokens, skip_special_tokens=True), stop_strings)
      turns[b] = Turn(tokens, out.raw_logprobs[b, lo:hi].tolist(), text, out.finish_reason[b])
      self._lengths[b] = hi
    self._ready.clear()
    return turns

  def append(self, tokens):
    tokens = {b: list(t) for b, t in tokens.items() if len(t)}
    if tokens:
      self.session.append(tokens)
    for b, t in tokens.items():
      self._lengths[b] += len(t)
      self._ready.add(b)


class LLMPolicy:
  """A `search_r1.policy.Policy` over an LLM client: each ready row's turn is one `llm.complete` of its
  whole context (prompt, turns, appended tokens) with the turn's budget and stop strings; log-probs are
  the client's raw ones (untempered) when it gives them."""

  def __init__(self, llm, tokenizer, temperature=None):
    self.llm, self.tok, self.temperature = llm, tokenizer, temperature
    self.contexts: dict[int, list[int]] = {}
    self._ready: set[int] = set()

  def start(self, prompts):
    self.contexts = {b: list(p) for b, p in enumerate(prompts)}
    self._ready = set(self.contexts)

  def decode(self, max_new_tokens, stop_strings):
    turns = {}
    for b in sorted(self._ready):
      c = self.llm.complete(self.contexts[b], max_tokens=max_new_tokens, stop=list(stop_strings),
                            temperature=self.temperature)
      tokens = list(c.response_ids)
      logprobs = list(c.raw_logprobs if c.raw_logprobs is not None else c.logprobs)[:len(tokens)]
      text, _ = cut_at_stop(self.tok.decode(tokens, skip_special_tokens=True), stop_strings)
      self.contexts[b] += tokens
      turns[b] = Turn(tokens, logprobs, text, c.finish_reason)
    self._ready.clear()
    return turns

  def append(self, tokens):
    for b, t in tokens.items():
      if len(t):
        self.contexts[b] += list(t)
        self._ready.add(b)


class ScriptedPolicy:
  """Emits fixed text: `script(row, turn_index) -> str` (or script[row][turn_index]), tokenised.

  Text with a stop string is cut after it ("stop"); longer than max_new_tokens tokens: truncated
  ("length"); otherwise the row ends its turn with `eos_id` appended when given ("eos").
  """

  def __init__(self, tokenizer, script: Callable[[int, int], str] | Sequence[Sequence[str]],
               eos_id: int | None = None):
    self.tokenizer, self.eos_id = tokenizer, eos_id
    self.script = script if callable(script) else self._from_lists(script)
    self._ready: set[int] = set()
    self.turns_taken: list[int] = []
    self.appended: list[list[list[int]]] = []

  @staticmethod
  def _from_lists(lists):
    def script(row, turn):
      if turn >= len(lists[row]):
        raise IndexError(f"ScriptedPolicy: row {row} has {len(lists[row])} scripted turns; turn {turn} "
                         "was requested")
      return lists[row][turn]
    return script

  def _ids(self, text):
    return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

  def start(self, prompts):
    self._ready = set(range(len(prompts)))
    self.turns_taken = [0] * len(prompts)
    self.appended = [[] for _ in prompts]

  def decode(self, max_new_tokens, stop_strings):
    turns = {}
    for b in sorted(self._ready):
      text, stopped = cut_at_stop(self.script(b, self.turns_taken[b]), stop_strings)
      self.turns_taken[b] += 1
      ids = self._ids(text)
      if len(ids) > max_new_tokens:
        ids, finish = ids[:max_new_tokens], "length"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
      elif stopped:
        finish = "stop"
      else:
        finish = "eos"
        ids = ids + ([self.eos_id] if self.eos_id is not None else [])
      turns[b] = Turn(ids, [0.0] * len(ids), text, finish)
    self._ready.clear()
    return turns

  def append(self, tokens):
    for b, t in tokens.items():
      if len(t):
        self.appended[b].append(list(t))
        self._ready.add(b)
