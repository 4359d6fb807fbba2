"""A small batching queue in front of `fineflax.sampling.generate` for concurrent agent calls.

Runner threads call `submit(prompt_ids, settings)` and block; one worker thread takes the first waiting
request, gathers whatever else arrives within `wait_s` (up to `max_batch`), and samples each set of
requests with equal settings (max_tokens, temperature, stop strings) in one `generate` call. Batch k
uses rng = fold_in(rng, k); rows keep arrival order. Same results as calling `generate` on that batch.
"""
from __future__ import annotations

import concurrent.futures
import queue
import threading
import time

import jax

from fineflax.sampling import generate


class Batcher:
  def __init__(self, policy, rng, *, max_batch: int = 64, wait_s: float = 0.01):
    if max_batch < 1:
      raise ValueError(f"max_batch={max_batch}: must be >= 1")
    self.policy, self.rng, self.max_batch, self.wait_s = policy, rng, max_batch, wait_s
    self.batches = 0  # generate calls so far
    self.batch_sizes: list[int] = []
    self._queue: queue.Queue = queue.Queue()
    self._closed = False
    self._thread = threading.Thread(target=self._run, name="llm-batcher", daemon=True)
    self._thread.start()

  def submit(self, prompt_ids, settings):
    """The `Completion` of one request (blocks until its batch is sampled)."""
    if self._closed:
      raise RuntimeError("Batcher is closed")
    future = concurrent.futures.Future()
    self._queue.put((list(prompt_ids), settings, future))
    return future.result()

  def close(self):
    self._closed = True
    self._queue.put(None)
    self._thread.join(timeout=5)

  def _run(self):
    while True:
      first = self._queue.get()
      if first is None:
        return
      pending, deadline = [first], time.time() + self.wait_s
      while len(pending) < self.max_batch:
        try:
          item = self._queue.get(timeout=max(deadline - time.time(), 0.0))
        except queue.Empty:
          break
        if item is None:
          self._queue.put(None)
          break
        pending.append(item)
      groups: dict = {}
      for item in pending:
        groups.setdefault(item[1], []).append(item)
      for settings, items in groups.items():
        try:
          outs = self.sample([p for p, _, _ in items], settings)
        except BaseException as e:  # reported to every caller of the batch
          for _, _, f in items:
            f.set_exception(e)
          continue
        for (_, _, f), out in zip(items, outs):
          f.set_result(out)

  def sample(self, prompts, settings):
    """One `Completion` per prompt from one `generate` call (batch counter advances)."""
    from fineflax.agents.llm import Completion
    max_tokens, temperature, stop = settings
    p = self.policy
    rng = jax.random.fold_in(self.rng, self.batches) if temperature > 0 else None
    self.batches += 1
    self.batch_sizes.append(len(prompts))
    out = generate(p.base, p.model_config, prompts, max_new_tokens=max_tokens, temperature=temperature,
                   top_p=p.top_p, stop_strings=stop, tokenizer=p.tokenizer, rng=rng, lora=p.lora,
                   lora_scale=p.lora_scale, dtype=p.dtype)
    result = []
    for i, prompt in enumerate(prompts):
      n = int(out.lengths[i])
      result.append(Completion(out.texts[i], list(prompt), out.tokens[i, :n].tolist(),
                               out.logprobs[i, :n].tolist(), out.raw_logprobs[i, :n].tolist(),
                               out.finish_reason[i]))
    return result
