"""Prompt and appended-token inputs of the samplers: conversion to token lists and their checks."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def prompts_as_lists(prompt_tokens, prompt_mask=None) -> list[list[int]]:
  """Token lists from a list of lists, or from an array [B, T] (with `prompt_mask` [B, T]: 1 = token)."""
  if isinstance(prompt_tokens, (list, tuple)) and all(isinstance(p, (list, tuple)) for p in prompt_tokens):
    if prompt_mask is not None:
      raise ValueError("prompt_mask is only for array prompts; token lists carry no padding")
    return [list(p) for p in prompt_tokens]
  arr = np.asarray(prompt_tokens)
  if arr.ndim != 2:
    raise ValueError(f"prompt_tokens: expected token lists or an array [B, T], got shape {arr.shape}")
  if prompt_mask is None:
    return arr.tolist()
  mask = np.asarray(prompt_mask).astype(bool)
  if mask.shape != arr.shape:
    raise ValueError(f"prompt_mask shape {mask.shape} != prompt_tokens shape {arr.shape}")
  return [row[m].tolist() for row, m in zip(arr, mask)]


def check_ids(ids: Sequence[int], vocab_size: int, what: str) -> None:
  """Raises ValueError naming `what` when a token id is outside [0, vocab_size)."""
  bad = [t for t in ids if not 0 <= t < vocab_size]
  if bad:
    raise ValueError(f"{what}: token ids {bad[:5]} outside the vocabulary [0, {vocab_size})")


def checked_prompts(prompts, vocab_size: int) -> list[list[int]]:
  """The prompts as int lists; raises ValueError for no prompts, an empty one or an id outside the vocabulary."""
  prompts = [[int(t) for t in p] for p in prompts]
  if not prompts:
    raise ValueError("start(): no prompts")
  for i, p in enumerate(prompts):
    if not p:
      raise ValueError(f"start(): prompt {i} is empty")
    check_ids(p, vocab_size, f"prompt {i}")
  return prompts


def checked_appends(tokens: Mapping[int, Sequence[int]] | Sequence[Sequence[int]], num_rows: int,
                    vocab_size: int) -> dict[int, list[int]]:
  """{row: int list} from one list per row or a {row: list} mapping (`SamplerSession.append`'s input);
  raises ValueError for a wrong number of lists, a row out of range or an id outside the vocabulary."""
  if not isinstance(tokens, Mapping):
    if len(tokens) != num_rows:
      raise ValueError(f"append(): got {len(tokens)} token lists for {num_rows} rows")
    tokens = dict(enumerate(tokens))
  out = {}
  for b, toks in tokens.items():
    if not 0 <= b < num_rows:
      raise ValueError(f"append(): row {b} out of range [0, {num_rows})")
    out[b] = [int(t) for t in toks]
    check_ids(out[b], vocab_size, f"append row {b}")
  return out


def checked_decode_args(max_new_tokens: int, stop_strings: Sequence[str], tokenizer) -> tuple[str, ...]:
  """The non-empty stop strings of a `SamplerSession.decode` call; raises ValueError for stop strings
  without a tokenizer or max_new_tokens < 1."""
  stop_strings = tuple(s for s in stop_strings if s)
  if stop_strings and tokenizer is None:
    raise ValueError(f"stop_strings={stop_strings} need a tokenizer (SamplerSession(tokenizer=...))")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
  return stop_strings


def group_identical(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
  """Row indices grouped by identical prompt, groups in order of first appearance."""
  groups: dict[tuple, list[int]] = {}
  for r, p in enumerate(prompts):
    groups.setdefault(tuple(p), []).append(r)
  return list(groups.values())
