"""What a server job is checked against before it is queued (`Limits`), in the engine's process or in a front end's
(`serve.remote`): 400s need no round trip to the engine."""
from __future__ import annotations

import dataclasses

from fineflax.engine.pages import pages_for


@dataclasses.dataclass(frozen=True)
class Limits:
  """What a job is checked against before it is queued: the engine's context (positions a request may take),
  slots, KV page size, pages a sequence can use (the pool less the trash page) and adapter names. A front end
  in another process (`serve.remote`) gets them from the engine and checks its jobs itself."""
  context: int
  slots: int
  page_size: int
  pool_pages: int
  adapters: tuple = ()

  def pages_needed(self, prompt_len: int, max_tokens: int, n: int) -> int:
    """KV pages the largest group of a job (min(n, slots) rows sharing the prompt's full pages) may hold at
    once, copies on write included: an upper bound of what the engine's admission reserves for it."""
    g, size = min(n, self.slots), pages_for(prompt_len + max_tokens, self.page_size)
    shared = (prompt_len - 1) // self.page_size
    return size + (g - 1) * (size - shared) + (g > 1)

  def check(self, job) -> None:
    """`job` (`serve.engine.Job`): ValueError for an unknown adapter, an empty prompt, a prompt + max_tokens past
    the context or rows that need more KV pages than the whole pool."""
    if job.adapter is not None and job.adapter not in self.adapters:
      raise ValueError(f"unknown adapter {job.adapter!r}; loaded: {sorted(self.adapters)}")
    if not job.prompt:
      raise ValueError("empty prompt")
    if len(job.prompt) + job.max_tokens > self.context:
      raise ValueError(f"prompt of {len(job.prompt)} tokens + max_tokens={job.max_tokens} exceeds the "
                       f"context of {self.context} tokens")
    need = self.pages_needed(len(job.prompt), job.max_tokens, job.n)
    if need > self.pool_pages:
      raise ValueError(f"the request needs {need} KV pages ({min(job.n, self.slots)} rows of {len(job.prompt)} "
                       f"prompt + {job.max_tokens} new tokens) but the pool holds {self.pool_pages} (--pages); "
                       "lower max_tokens or n")
