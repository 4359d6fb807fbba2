"""A request to the engine (`Request`) and the state of its sequence (`Sequence`), host side only."""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence as Seq

import jax
import jax.numpy as jnp
import numpy as np

FINISHED = ("eos", "stop", "length", "cancelled")


@dataclasses.dataclass
class Request:
  """One prompt to continue. max_new_tokens: tokens the first decode may generate (0 with hold=True:
  prefill only, `Engine.resume` gives budgets later). reserve: completion tokens (generated and appended)
  the sequence may ever hold, default max_new_tokens (pages are reserved for prompt + reserve).
  key: a PRNG key (typed or raw uint32[2], threefry), needed when temperature > 0. eos_ids None: the
  engine's. hold: keep the sequence and its pages after it finishes (for `append` / `resume`; `release`
  frees it). on_update(seq): called after each step in which the sequence got tokens or finished.
  adapter: index into the engine's `adapters` (None: the base, or the engine's one `lora`)."""
  prompt: Seq[int]
  max_new_tokens: int
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  key: object = None
  eos_ids: Seq[int] | None = None
  stop_strings: Seq[str] = ()
  reserve: int | None = None
  hold: bool = False
  on_update: Callable | None = None
  adapter: int | None = None


@dataclasses.dataclass(eq=False)
class Sequence:
  """A request's state. tokens / logprobs / raw_logprobs / model: the completion so far (model False for
  appended tokens, whose log-probs are 0); status: waiting | prefill | fork (waits for its group's prompt)
  | ready (decodes while budget > 0) | eos | stop | length | cancelled."""
  id: int
  request: Request
  prompt: list
  key: np.ndarray
  eos: tuple
  tokens: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  raw_logprobs: list = dataclasses.field(default_factory=list)
  model: list = dataclasses.field(default_factory=list)
  status: str = "waiting"
  budget: int = 0
  cache_len: int = 0  # positions in the cache
  count: int = 0  # tokens sampled so far (the key's counter)
  seg_start: int = 0  # start of the current model segment (stop strings look at it only)
  excess_chars: int = 0  # text past the stop string's end inside the last token
  stop_strings: tuple = ()
  stop_scan: object = None  # the segment's incremental stop-string search (`engine.stops.StopScan`)
  leader: "Sequence | None" = None  # group member: shares this sequence's prompt pages
  followers: list = dataclasses.field(default_factory=list)
  preemptions: int = 0  # times its pages were freed to be recomputed (admission="watermark")

  @property
  def prompt_len(self) -> int:
    return len(self.prompt)

  @property
  def full(self) -> list:
    return self.prompt + self.tokens

  @property
  def max_len(self) -> int:
    """Positions the sequence may ever reach: prompt + reserve."""
    r = self.request
    return len(self.prompt) + (r.max_new_tokens if r.reserve is None else r.reserve)

  @property
  def room(self) -> int:
    return self.max_len - len(self.full)

  @property
  def finished(self) -> bool:
    return self.status in FINISHED


def key_data(key) -> np.ndarray:
  """uint32 [2] key data of a typed or raw threefry key (zeros for None: greedy rows draw nothing)."""
  if key is None:
    return np.zeros(2, np.uint32)
  if jnp.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  data = np.asarray(key, np.uint32)
  if data.shape != (2,):
    raise ValueError(f"key: expected a threefry key (uint32[2] data), got data of shape {data.shape}")
  return data

