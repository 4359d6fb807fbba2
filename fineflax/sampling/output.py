"""SampleOutput: the completions of a batch of prompts as right-padded NumPy arrays."""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class SampleOutput:
  """Completions, right-padded to width N (NumPy arrays; B = number of prompts).

  tokens [B, N] int32; logprobs [B, N] f32 (sampling distribution, 0 under greedy); raw_logprobs [B, N]
  f32 (untempered policy: log_softmax(logits)[token]); mask [B, N] (1 = model-generated token, not
  padding, not appended); valid [B, N] (1 = part of the completion: model or appended tokens);
  lengths [B] (valid tokens); finish_reason: "eos" | "stop" | "length" per row; texts (with a tokenizer).
  """
  tokens: np.ndarray
  logprobs: np.ndarray
  raw_logprobs: np.ndarray
  mask: np.ndarray
  valid: np.ndarray
  lengths: np.ndarray
  finish_reason: list[str]
  prompt_lengths: np.ndarray
  texts: list[str] | None = None


def build_output(rows, width: int | None = None, tokenizer=None) -> SampleOutput:
  """The SampleOutput of rows with attributes tokens, logprobs, raw_logprobs, model (lists over the
  completion), status, prompt_len and excess_chars (text past a stop string inside the last token), right-
  padded to `width` (default: the longest completion)."""
  longest = max([len(r.tokens) for r in rows] + [1])
  width = longest if width is None else width
  if width < longest:
    raise ValueError(f"result(width={width}) is shorter than the longest completion ({longest})")
  arr = lambda attr, dt: np.array([list(getattr(r, attr)) + [0] * (width - len(r.tokens)) for r in rows], dt)
  lengths = np.array([len(r.tokens) for r in rows], np.int32)
  texts = None
  if tokenizer is not None:
    texts = []
    for r in rows:
      text = tokenizer.decode(r.tokens, skip_special_tokens=True)
      texts.append(text[:len(text) - r.excess_chars])
  return SampleOutput(
      tokens=arr("tokens", np.int32), logprobs=arr("logprobs", np.float32),
      raw_logprobs=arr("raw_logprobs", np.float32), mask=arr("model", bool),
      valid=np.arange(width)[None, :] < lengths[:, None], lengths=lengths,
      finish_reason=[r.status for r in rows],
      prompt_lengths=np.array([r.prompt_len for r in rows], np.int32), texts=texts)
