"""The engine's admission and preemption (`Engine(admission=...)`): rows admitted on what they hold now
plus a watermark, the newest preempted and recomputed when the pool runs dry, with the tokens unchanged;
finished rows replaced within the step; no compile mid-run after `warm_up`; a group's leader cancelled
mid-prefill hands its pages to a follower (issue 45 item 4)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _sampling_fixtures import tiny_llama
from fineflax.engine import Engine, Request
from fineflax.engine.compiles import CompileCounter

PAGE = 4


def _engine(max_rows, num_pages, **kw):
  _, params, config = tiny_llama()
  kw = dict(dict(page_size=PAGE, dtype=jnp.float32, eos_ids=(), chunk_size=8), **kw)
  return Engine(params, config, max_rows=max_rows, num_pages=num_pages, **kw)


def _workload():
  """Long-tail requests, greedy and sampled, and one group of 3 sharing a prompt (submitted with n=3)."""
  rng = np.random.default_rng(5)
  key = jax.random.key(21)
  reqs = []
  for i in range(7):
    prompt = [int(t) for t in rng.integers(3, 96, size=4 + 3 * i)]
    reqs.append((Request(prompt, max_new_tokens=[6, 40, 9, 28, 3, 33, 12][i], temperature=0.0 if i % 2 else 0.9,
                         top_k=0 if i != 3 else 7, key=jax.random.fold_in(key, i)), 1))
  reqs.insert(2, (Request([7, 8, 9, 10, 11, 12, 13], max_new_tokens=24, temperature=1.0,
                          key=jax.random.fold_in(key, 99)), 3))
  return reqs


def _run(engine, reqs):
  seqs = []
  for req, n in reqs:
    out = engine.submit(req, n=n)
    seqs += out if n > 1 else [out]
  engine.run()
  engine.pages.check()
  assert engine.pages.num_used == 0
  return seqs


def test_preempted_rows_recompute_and_decode_the_same_tokens():
  """A pool of 24 pages (the reserves sum to 87): rows are preempted and recomputed, and every row,
  greedy or sampled, decodes the tokens and log-probs of a pool that never runs dry. Sampled rows can:
  token t of a row is drawn with fold_in(row key, t) (`device.decode_chunk`, the host's `keys.fold_in`),
  a function of the row's key and position only, and a preempted row keeps its key and counter."""
  reqs = _workload()
  ref = _run(_engine(4, 128, admission="reserve"), reqs)
  small = _engine(4, 24)
  seqs = _run(small, reqs)
  assert small.stats["preemptions"] > 0 and small.stats["recomputed_tokens"] > 0
  assert sum(s.preemptions for s in seqs) == small.stats["preemptions"]
  assert any(s.preemptions and s.request.temperature > 0 for s in seqs)  # a sampled row was recomputed
  for a, b in zip(seqs, ref):
    assert a.tokens == b.tokens and a.status == b.status, (a.id, a.tokens, b.tokens)
    np.testing.assert_allclose(a.raw_logprobs, b.raw_logprobs, atol=1e-5)
  assert small.stats["peak_pages"] <= 23


def test_watermark_admission_keeps_more_rows_in_flight_than_reserving():
  """Reserves (60 tokens) much longer than the answers (8): reserving admits rows by their whole reserve,
  the watermark by what they take in their next chunk, so more rows decode at once, with the same tokens."""
  rng = np.random.default_rng(2)
  reqs = [(Request([int(t) for t in rng.integers(3, 96, size=6)], max_new_tokens=8, reserve=60), 1)
          for _ in range(8)]
  peaks = {}
  for admission in ("reserve", "watermark"):
    engine = _engine(8, 40, admission=admission)
    seqs = _run(engine, reqs)
    peaks[admission] = (engine.stats["peak_rows"], [s.tokens for s in seqs], engine.stats["preemptions"])
  assert peaks["reserve"][0] == 2 and peaks["watermark"][0] == 8  # 2 x 17 pages of 39 vs 8 x 4
  assert peaks["reserve"][1] == peaks["watermark"][1] and peaks["watermark"][2] == 0


def test_finished_rows_are_replaced_within_the_step():
  """While requests wait, every decode call runs max_rows rows: a row that finished in one step's decode
  is replaced (admitted and prefilled) before the next decode call."""
  rng = np.random.default_rng(4)
  engine = _engine(3, 64)
  for i in range(9):
    engine.submit(Request([int(t) for t in rng.integers(3, 96, size=5)], max_new_tokens=[3, 11, 19][i % 3]))
  rows = []
  while engine.waiting:
    before = engine.stats["decode_rows"]
    engine.step()
    rows.append(engine.stats["decode_rows"] - before)
  engine.run()
  assert len(rows) > 3 and set(rows) == {3}


def test_preemption_compiles_nothing_after_warm_up():
  """warm_up(max_len) compiles every program a step can meet; recomputing preempted rows (prefills of
  prompt + tokens) and their re-admission compile nothing more."""
  engine = _engine(4, 24, chunk_size=8, prefill_chunk=32)
  engine.warm_up(64)
  counter = CompileCounter()
  _run(engine, [(r, n) for r, n in _workload() if r.temperature == 0])
  assert engine.stats["preemptions"] > 0 and counter.count == 0


def test_a_leader_cancelled_mid_prefill_hands_its_pages_to_a_follower():
  """Issue 45 item 4: a 600-token prompt, n=4, a 43-page pool (the group's reserve: 42 pages), the leader
  cancelled after its first 512-token block. Before: each waiting follower prefilled the whole prompt
  into pages admission had not counted (OutOfPages from step()). Now the first follower takes the
  leader's pages and prefills only the rest; the others share them; their tokens are those of the group
  never cancelled."""
  prompt = [int(t) for t in np.random.default_rng(0).integers(3, 96, 600)]
  req = Request(prompt, max_new_tokens=8, temperature=1.0, key=jax.random.key(1))
  ref_engine = _engine(4, 200, page_size=16)
  ref = ref_engine.submit(req, n=4)
  ref_engine.run()
  for admission in ("reserve", "watermark"):
    engine = _engine(4, 43, page_size=16, admission=admission)
    group = engine.submit(req, n=4)
    engine.step()
    assert group[0].cache_len == 512 and [s.status for s in group[1:]] == ["fork"] * 3
    engine.cancel(group[0])
    engine.run()
    assert [s.status for s in group] == ["cancelled", "length", "length", "length"]
    assert [s.tokens for s in group[1:]] == [s.tokens for s in ref[1:]]
    assert engine.stats["prefill_tokens"] == 599 and engine.stats["preemptions"] == 0
    engine.pages.check()
    assert engine.pages.num_used == 0


def test_a_pool_too_small_for_two_rows_runs_them_one_after_the_other():
  """Two samples of 11 positions (3 pages of 4 each), a pool of 3 pages: reserving admission refuses the
  group (test_engine_errors); the watermark's admits it, preempts the second row, and runs it after the
  first, with the tokens of a pool that holds both."""
  req = Request([3, 4], max_new_tokens=9, temperature=1.0, key=jax.random.key(4))
  ref_engine = _engine(2, 16)
  ref = ref_engine.submit(req, n=2)
  ref_engine.run()
  engine = _engine(2, 4)
  group = engine.submit(req, n=2)
  engine.run()
  assert [s.tokens for s in group] == [s.tokens for s in ref] and engine.stats["peak_rows"] == 1
  assert group[1].preemptions == 1 and engine.pages.num_used == 0


def test_a_held_rows_pages_are_never_preempted():
  """A finished held row keeps its pages (its owner may append and resume it): a row that needs them is
  preempted itself, `run` names the held rows, and once the owner releases the held row the waiting one
  recomputes and ends with the tokens it has alone."""
  engine = _engine(2, 8)  # 7 pages of 4 positions
  held = engine.submit(Request([5, 6, 7, 8, 9], max_new_tokens=3, hold=True))
  engine.run()
  assert held.status == "length" and len(engine.pages.tables[held.id]) == 2
  seq = engine.submit(Request([10, 11], max_new_tokens=20))  # 22 positions: 6 pages, 5 free
  with pytest.raises(RuntimeError, match="live sequences are held"):
    engine.run()
  assert seq.status == "waiting" and seq.preemptions == 1 and len(engine.pages.tables[held.id]) == 2
  engine.release(held)
  engine.run()
  alone = _engine(1, 8)
  ref = alone.submit(Request([10, 11], max_new_tokens=20))
  alone.run()
  assert seq.tokens == ref.tokens and seq.status == "length" and engine.pages.num_used == 0


@pytest.mark.fast
def test_admission_errors():
  with pytest.raises(ValueError, match="admission='greedy'"):
    _engine(1, 8, admission="greedy")
  with pytest.raises(ValueError, match="watermark=1.5"):
    _engine(1, 8, watermark=1.5)
