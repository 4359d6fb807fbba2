"""The runner's generation loop (fineflax.evals.bench_decode) on a stand-in engine: admission only in waves
of whole rows, never more than `live` rows at once, every row handed back once with its n samples; and the
per-row sampling keys against fold_in one at a time."""
from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from fineflax.evals.bench_decode import admission_wave, decode_rows, row_id, sample_keys

pytestmark = pytest.mark.fast


class StandInEngine:
  """Admits every submitted group at the next step (as `Engine` does when rows and pages allow); each
  sequence finishes after its prompt's first token many steps. Records the rows busy at each step."""

  def __init__(self, max_rows: int):
    self.max_rows, self.live, self.waiting, self.busy = max_rows, [], [], []

  def submit_group(self, requests):
    group = [types.SimpleNamespace(left=int(q.prompt[0]), tokens=[7] * int(q.prompt[0]), excess_chars=0,
                                   finished=False, key=q.key) for q in requests]
    self.waiting.append(group)
    return group

  def step(self) -> bool:
    while self.waiting and len(self.live) + len(self.waiting[0]) <= self.max_rows:
      self.live += self.waiting.pop(0)
    if not self.live:
      return False
    self.busy.append(len(self.live))
    for s in self.live:
      s.left -= 1
      s.finished = s.left <= 0
    self.live = [s for s in self.live if not s.finished]
    return True


@pytest.mark.parametrize("live,n,wave", [(16, 4, 4), (16, 4, 8), (12, 3, 3), (8, 1, 8), (5, 1, 1)])
def test_rows_enter_in_waves_and_come_back_whole(live, n, wave):
  rng = np.random.default_rng(live * n + wave)
  prompts = [[int(x)] for x in rng.integers(1, 9, 37)]
  keys = rng.integers(0, 2**32, (37, n, 2), dtype=np.uint32)
  engine, handed = StandInEngine(live), []
  stats = decode_rows(engine, prompts, keys, n=n, max_new_tokens=9, temperature=0.7, top_p=1.0, wave=wave,
                      live=live, on_rows=handed.append)
  rows = [r for batch in handed for r, _ in batch]
  assert sorted(rows) == list(range(37))  # each row once
  for batch in handed:
    for r, seqs in batch:
      assert len(seqs) == n and all(s.finished for s in seqs)
      assert [s.key.tolist() for s in seqs] == keys[r].tolist()  # sample j gets key [r, j]
  assert all(len(b) * n >= wave for b in handed[:-1])  # batches of at least a wave, the rest at the end
  assert max(engine.busy) <= live
  # admission sizes: multiples of the wave, but for one that holds the last rows
  odd = [k for k in stats.admissions if k % wave]
  assert odd == [] or (len(odd) == 1 and stats.admissions[odd[0]] == 1 and odd[0] % wave == 37 * n % wave)
  assert sum(k * v for k, v in stats.admissions.items()) == 37 * n


def test_wave_must_be_whole_rows():
  with pytest.raises(ValueError, match="wave=6: must be a multiple of n=4"):
    decode_rows(StandInEngine(8), [[1]], np.zeros((1, 4, 2), np.uint32), n=4, max_new_tokens=1, temperature=0.0,
                top_p=1.0, wave=6, live=8, on_rows=print)


@pytest.mark.parametrize("live,n,wave", [(256, 4, 32), (256, 8, 32), (8, 2, 2), (4, 4, 4), (64, 1, 8)])
def test_admission_wave(live, n, wave):
  assert admission_wave(live, n) == wave


def test_sample_keys_fold_in_row_then_sample():
  ids = [row_id("gsm8k", "f.jsonl:row 3"), row_id("nq", "f.jsonl:row 3"), 0]
  assert ids[0] != ids[1] and ids[0] == row_id("gsm8k", "f.jsonl:row 3") and 0 <= ids[0] < 2**31
  keys = sample_keys(5, ids, 3)
  for r, i in enumerate(ids):
    for j in range(3):
      want = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(5), i), j)
      np.testing.assert_array_equal(keys[r, j], np.asarray(want))
