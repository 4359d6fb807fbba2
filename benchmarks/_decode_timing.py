"""Decode timings shared by benchmarks/engine.py and benchmarks/profile_engine.py: the paged engine (prompts
held, then resumed) and the static-cache session, each timed on its decode alone (prefill excluded)."""
from __future__ import annotations

import time


def hold_prompts(engine, prompts, room: int) -> list:
  """The prompts prefilled and held (each reserving `room` new tokens): the sequences, on the device."""
  import jax
  from fineflax.engine import Request
  seqs = [engine.submit(Request(p, max_new_tokens=0, hold=True, reserve=room)) for p in prompts]
  engine.run()
  jax.block_until_ready(engine.pool)
  return seqs


def resume_rows(engine, seqs, new: int) -> tuple[float, int]:
  """(decode wall s, decode steps): every held row resumed for `new` tokens, then released."""
  steps0 = engine.stats["decode_steps"]
  t = time.perf_counter()
  for s in seqs:
    engine.resume(s, new)
  engine.run()
  timing = (time.perf_counter() - t, engine.stats["decode_steps"] - steps0)
  assert all(len(s.tokens) == new for s in seqs), "a row stopped early"
  for s in seqs:
    engine.release(s)
  return timing


def decode_once(engine, prompts, new: int, room: int) -> tuple[float, int]:
  """(decode wall s, decode steps): `hold_prompts` untimed, then `resume_rows`."""
  return resume_rows(engine, hold_prompts(engine, prompts, room), new)


def time_decode(engine, prompts, new: int, room: int) -> tuple[float, int]:
  """`decode_once` of the second of two runs (the first also compiles the prefill program)."""
  return [decode_once(engine, prompts, new, room) for _ in range(2)][-1]


def static_session(params, config, room: int, chunk_size: int):
  """A greedy bf16 `SamplerSession(cache="static")` whose cache holds `room` new tokens after the prompts."""
  import jax.numpy as jnp
  from fineflax.sampling import SamplerSession
  return SamplerSession(params, config, max_total_len=room, temperature=0.0, eos_ids=(), dtype=jnp.bfloat16,
                        cache="static", chunk_size=chunk_size)


def static_start(session, prompts) -> None:
  """The prompts prefilled into the static session, on the device."""
  import jax
  session.start(prompts)
  jax.block_until_ready(session._static.cache)


def static_decode(session, new: int) -> tuple[float, int]:
  """(decode wall s, steps) of `new` tokens after `static_start`."""
  t = time.perf_counter()
  session.decode(new)
  return time.perf_counter() - t, new


def static_once(session, prompts, new: int) -> tuple[float, int]:
  """(decode wall s, steps): the prompts prefilled untimed, then `new` tokens decoded."""
  static_start(session, prompts)
  return static_decode(session, new)


def time_static(params, config, prompts, new: int, room: int, chunk_size: int) -> tuple[float, int]:
  """`static_once` of the second of two runs of one static session sized for `room`."""
  session = static_session(params, config, room, chunk_size)
  return [static_once(session, prompts, new) for _ in range(2)][-1]
