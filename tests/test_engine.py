"""The engine's scheduling: a refilled row's output equals the same request decoded alone (greedy and
sampled, per-row settings mixed in one batch); the n samples of a group prefill their prompt once and
share its pages; streaming callbacks and cancellation; clear errors."""
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _sampling_fixtures import tiny_llama
from fineflax.engine import Engine, Request
from fineflax.sampling import generate

PAGES, PAGE = 96, 4


def _engine(max_rows, num_pages=PAGES, **kw):
  _, params, config = tiny_llama()
  return Engine(params, config, max_rows=max_rows, num_pages=num_pages, page_size=PAGE, dtype=jnp.float32,
                eos_ids=(), chunk_size=8, **kw)


def _requests():
  key = jax.random.key(7)
  return [Request([5, 6, 7, 8, 9], max_new_tokens=14),
          Request(list(range(10, 31)), max_new_tokens=6, temperature=1.0, top_p=0.9, key=jax.random.fold_in(key, 1)),
          Request([30, 31], max_new_tokens=20, temperature=0.7, top_k=5, key=jax.random.fold_in(key, 2)),
          Request([40, 41, 42], max_new_tokens=9, eos_ids=(11, 23, 57)),
          Request([3] * 9, max_new_tokens=11, temperature=1.3, key=jax.random.fold_in(key, 4))]


def test_refilled_rows_equal_each_request_decoded_alone():
  seen = []  # (decode calls so far, tokens so far) at each before_decode_call: before each call, after the last's results
  engine = _engine(max_rows=2, before_decode_call=lambda: seen.append(
      (engine.stats["decode_calls"], sum(len(s.tokens) for s in seqs))))
  seqs = [engine.submit(r) for r in _requests()]
  live, t0 = [], time.perf_counter()
  while engine.step():
    live.append(len(engine.live))
  wall = time.perf_counter() - t0
  assert max(live) == 2 and len(live) > 3  # rows were refilled as others finished
  # the decode calls' time, split into the call and the wait for its results, lies within the run's wall time
  # and the host time between chunks (here every step decodes: a gap before each chunk but the first)
  st = engine.stats
  assert st["dispatch_s"] > 0 and st["wait_s"] > 0 and st["gap_s"] > 0
  assert st["dispatch_s"] + st["wait_s"] + st["gap_s"] < wall
  assert st["gaps"] == st["decode_calls"] - 1
  assert [c for c, _ in seen] == list(range(st["decode_calls"]))
  assert all(b[1] > a[1] for a, b in zip(seen, seen[1:]))  # the last chunk's tokens are in before the next call
  for req, seq in zip(_requests(), seqs):
    alone = _engine(max_rows=1)
    ref = alone.submit(req)
    alone.run()
    assert seq.status == ref.status and seq.tokens == ref.tokens, (req, seq.tokens, ref.tokens)
    np.testing.assert_allclose(seq.raw_logprobs, ref.raw_logprobs, atol=1e-5)
    np.testing.assert_allclose(seq.logprobs, ref.logprobs, atol=1e-5)
  assert seqs[3].status in ("eos", "length") and [s.status for s in seqs].count("length") >= 3
  assert engine.pages.num_used == 0
  engine.pages.check()


def test_a_group_prefills_its_prompt_once_and_shares_its_full_pages():
  """39-token prompt: 38 positions prefilled = 9 full pages of 4 + one holding 2. Each of 8 samples then
  writes 5 positions: a copy of the partial page (7 copies; the last writer keeps the original) and one
  page more. Pages at the peak: 9 + 8 * 2 = 25, where 8 unshared rows take 8 * 11 = 88."""
  prompt = list(range(3, 42))
  req = Request(prompt, max_new_tokens=5, temperature=1.0, key=jax.random.key(3))
  shared = _engine(max_rows=8)
  group = shared.submit(req, n=8)
  shared.run()
  assert shared.stats["prefill_tokens"] == 38 and shared.stats["copied_pages"] == 7
  assert shared.stats["peak_pages"] == 9 + 8 * 2
  apart = _engine(max_rows=8)
  alone = [apart.submit(Request(prompt, max_new_tokens=5, temperature=1.0, key=jax.random.fold_in(req.key, i)))
           for i in range(8)]
  apart.run()
  assert apart.stats["prefill_tokens"] == 8 * 38 and apart.stats["peak_pages"] == 8 * 11
  assert [s.tokens for s in group] == [s.tokens for s in alone]
  assert len({tuple(s.tokens) for s in group}) > 1  # the samples differ
  assert shared.pages.num_used == 0


def test_streaming_callbacks_and_cancel():
  engine = _engine(max_rows=4)
  seen = {}

  def on_update(seq):
    seen.setdefault(seq.id, []).append((len(seq.tokens), seq.status))
    if seq.id == 0 and len(seq.tokens) >= 8 and not seq.finished:
      engine.cancel(seq)

  a = engine.submit(Request([5, 6, 7], max_new_tokens=30, on_update=on_update))
  b = engine.submit(Request([8, 9], max_new_tokens=20, on_update=on_update))
  engine.run()
  assert a.status == "cancelled" and len(a.tokens) == 8 and b.status == "length" and len(b.tokens) == 20
  assert [n for n, _ in seen[b.id]] == [8, 16, 20] and seen[b.id][-1][1] == "length"
  assert engine.pages.num_used == 0
  engine.pages.check()
  group = engine.submit(Request([8, 9, 10], max_new_tokens=3), n=3)
  engine.cancel(group[0])  # a waiting group's first member: the next one prefills the prompt
  engine.run()
  assert [s.status for s in group] == ["cancelled", "length", "length"] and engine.pages.num_used == 0
  alone = _engine(max_rows=1)
  ref = alone.submit(Request([8, 9], max_new_tokens=20))
  alone.run()
  assert b.tokens == ref.tokens


def test_a_long_prompt_prefills_in_blocks_while_other_rows_decode():
  engine = _engine(max_rows=2, prefill_chunk=16, prefill_tokens=16)
  a = engine.submit(Request([5, 6, 7], max_new_tokens=40))
  engine.step()
  b = engine.submit(Request(list(range(3, 60)), max_new_tokens=4))
  progress = []
  while b.status in ("waiting", "prefill"):
    engine.step()
    progress.append((len(a.tokens), b.cache_len))
  # 56 prompt positions in blocks of 16; in the step its prefill ends, b decodes its 4 tokens too
  assert [n for _, n in progress] == [16, 32, 48, 56 + 4] and len({n for n, _ in progress}) == 4  # a kept going
  engine.run()
  for seq in (a, b):
    alone = _engine(max_rows=1)
    ref = alone.submit(seq.request)
    alone.run()
    assert seq.tokens == ref.tokens


def test_interleaved_prefill_decodes_the_first_rows_after_one_prefill_call():
  """A burst of prompts: each step prefills one budget of them, then decodes every prefilled row (the first
  row's first tokens come after one prefill call and one decode chunk, not after the whole burst's prefill)."""
  prompts = [list(range(3 + i, 13 + i)) for i in range(4)]
  outs = {}
  for interleave in (True, False):
    engine = _engine(max_rows=4, prefill_chunk=16, prefill_tokens=16, interleave_prefill=interleave)
    seqs = [engine.submit(Request(p, max_new_tokens=20)) for p in prompts]
    counts = []
    for _ in range(2):
      engine.step()
      counts.append([len(s.tokens) for s in seqs])
    engine.run()
    outs[interleave] = ([s.tokens for s in seqs], counts)
  assert outs[True][1] == [[8, 0, 0, 0], [16, 8, 0, 0]]  # 10-token prompts: one row per 16-token call
  assert outs[False][1] == [[8, 8, 8, 8], [16, 16, 16, 16]]
  assert outs[True][0] == outs[False][0]


def test_the_prefix_cache_prefills_only_the_unseen_suffix_and_changes_no_token():
  """Requests sharing system prompts, some one after another, some side by side, in a pool small enough to
  evict: the same tokens and log-probs as without the cache; a repeated system prompt is not prefilled
  again (counted); every page accounted for."""
  rng = np.random.default_rng(3)
  systems = [[int(t) for t in rng.integers(3, 90, size=n)] for n in (21, 13, 30)]
  key = jax.random.key(11)
  reqs = [Request(systems[i % 3] + [int(t) for t in rng.integers(3, 90, size=1 + i % 4)], max_new_tokens=6 + i % 5,
                  temperature=0.0 if i % 2 else 0.8, key=jax.random.fold_in(key, i)) for i in range(12)]
  runs = {}
  for cached, pages in ((True, PAGES), (False, PAGES), ("evicting", 14)):  # 14: a request takes up to 11
    engine = _engine(max_rows=2, num_pages=pages, prefix_cache=bool(cached))
    seqs = []
    for i in range(0, len(reqs), 3):  # three at a time: two side by side, the third refills a row
      seqs += [engine.submit(r) for r in reqs[i:i + 3]]
      engine.run()
      engine.pages.check()
    runs[cached] = (seqs, dict(engine.stats), engine)
  (on, stats, engine), (off, stats_off, _) = runs[True], runs[False]
  for a, b, c in zip(on, off, runs["evicting"][0]):
    assert a.tokens == b.tokens == c.tokens and a.status == b.status == c.status
    np.testing.assert_allclose(a.raw_logprobs, b.raw_logprobs, atol=1e-5)
    np.testing.assert_allclose(c.raw_logprobs, b.raw_logprobs, atol=1e-5)
  assert runs["evicting"][2].pages.evicted > 10 and runs["evicting"][1]["prefix_hit_tokens"] > 0
  assert engine.pages.evicted == 0
  assert stats_off["prefix_hit_tokens"] == 0 and stats_off["prefill_tokens"] == sum(len(r.prompt) - 1 for r in reqs)
  assert stats["prefill_tokens"] + stats["prefix_hit_tokens"] == stats_off["prefill_tokens"]
  assert stats["prefix_hit_tokens"] >= 6 * 12  # most requests after the first three reuse >= 3 pages
  assert engine.pages.num_cached > 0 and engine.pages.num_used == engine.pages.num_cached  # only the cache holds pages
  # one more request of the first system prompt: only its unseen suffix is prefilled
  before = dict(engine.stats)
  seq = engine.submit(Request(systems[0] + [7, 8], max_new_tokens=2))
  engine.run()
  assert engine.stats["prefix_hit_tokens"] - before["prefix_hit_tokens"] == 20  # 5 full pages of 4 of the 21
  assert engine.stats["prefill_tokens"] - before["prefill_tokens"] == len(seq.prompt) - 1 - 20


def test_generate_with_fewer_rows_than_prompts_and_pallas_attention_match():
  _, params, config = tiny_llama()
  prompts = [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [30, 31], [5, 6, 7, 8, 9], [44]]
  kw = dict(max_new_tokens=12, temperature=0.0, eos_ids=(), dtype=jnp.float32)
  ref = generate(params, config, prompts, **kw)
  for extra in (dict(max_rows=2), dict(attention="pallas")):
    out = generate(params, config, prompts, **kw, **extra)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.raw_logprobs, ref.raw_logprobs, atol=1e-5)


def test_engine_errors():
  engine = _engine(max_rows=2)
  with pytest.raises(ValueError, match="pass Request\\(key="):
    engine.submit(Request([3], max_new_tokens=4, temperature=1.0))
  with pytest.raises(ValueError, match="the prompt is empty"):
    engine.submit(Request([], max_new_tokens=4))
  with pytest.raises(ValueError, match="must fit the engine's max_rows=2"):
    engine.submit(Request([3], max_new_tokens=4), n=3)
  with pytest.raises(ValueError, match=r"token ids \[96\] outside the vocabulary"):
    engine.submit(Request([3, 96], max_new_tokens=4))
  with pytest.raises(ValueError, match="exceed a row's"):
    engine.submit(Request([3], max_new_tokens=PAGES * PAGE))
  seq = engine.submit(Request([3, 4], max_new_tokens=2))
  engine.run()
  with pytest.raises(ValueError, match="not a live held sequence"):
    engine.append(seq, [5])
  small = Engine(*tiny_llama()[1:], max_rows=2, num_pages=4, page_size=PAGE, dtype=jnp.float32, admission="reserve")
  small.submit(Request([3, 4], max_new_tokens=9), n=2)  # 3 pages each; the pool has 3 (the watermark's
  # admission runs them one after the other: tests/test_engine_schedule.py)
  with pytest.raises(RuntimeError, match="raise num_pages"):
    small.run()
  with pytest.raises(ValueError, match="attention='flash'"):
    _engine(max_rows=1, attention="flash")
