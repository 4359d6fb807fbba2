"""`generate`: one call from prompts to completions (a `SamplerSession` started, decoded once)."""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from fineflax.sampling.session import SampleOutput, SamplerSession


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


def generate(params, config, prompt_tokens, *, max_new_tokens: int, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, eos_ids: Sequence[int] | None = None,
             stop_strings: Sequence[str] = (), tokenizer=None, rng=None, lora=None,
             lora_scale: float = 1.0, dtype=jnp.bfloat16, prompt_mask=None,
             chunk_size: int = 32, mesh=None, impl: str | None = "auto",
             dense_base: bool = False) -> SampleOutput:
  """Samples up to `max_new_tokens` per prompt; returns a `SampleOutput` of width `max_new_tokens`.

  temperature 0 = greedy. eos_ids: None = the config's (and tokenizer's) EOS ids; () = never stop at
  EOS. stop_strings need `tokenizer`; rows end at their first stop string (see `SamplerSession`).
  Prompts: token lists of any lengths (left-padded internally), or an array with `prompt_mask`.
  mesh: a `fineflax.train.mesh` mesh; the rows (and KV cache) are split over its devices.
  impl: the decoder, "unrolled" or "scan"; "auto": unrolled on GPUs (see `sampling.decode.decode_impl`).
  dense_base: decode a quantised base from a dense copy of its dequantised weights (see `SamplerSession`).
  """
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
    raise ValueError(f"generate(max_new_tokens={max_new_tokens!r}): must be an integer >= 1")
  if stop_strings and tokenizer is None:
    raise ValueError(f"stop_strings={tuple(stop_strings)} need a tokenizer (generate(tokenizer=...))")
  session = SamplerSession(params, config, max_total_len=max_new_tokens, tokenizer=tokenizer,
                           temperature=temperature, top_k=top_k, top_p=top_p, eos_ids=eos_ids,
                           rng=rng, lora=lora, lora_scale=lora_scale, dtype=dtype,
                           chunk_size=chunk_size, mesh=mesh, impl=impl, dense_base=dense_base)
  session.start(prompts_as_lists(prompt_tokens, prompt_mask))
  session.decode(max_new_tokens, stop_strings)
  return session.result(width=max_new_tokens)
