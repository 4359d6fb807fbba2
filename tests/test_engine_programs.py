"""How many programs the engine compiles: a floor on the rows of a device call (padding rows change no
output), least-recently-used eviction of compiled decode chunks, and pool sizes that stay put from one RL
step to the next (the pool's shape is part of every program's signature)."""
import jax.numpy as jnp
import numpy as np
import pytest

from _sampling_fixtures import tiny_llama
from fineflax.engine import Engine, Request, programs as programs_mod
from fineflax.engine.device import geometric_bucket, page_bucket, row_bucket
from fineflax.engine.engine import default_min_row_bucket
from fineflax.sampling import session


def _run(min_row_bucket):
  _, params, config = tiny_llama()
  engine = Engine(params, config, max_rows=4, num_pages=64, page_size=4, dtype=jnp.float32, eos_ids=(),
                  chunk_size=8, min_row_bucket=min_row_bucket)
  seqs = [engine.submit(Request(list(range(3 + i, 9 + 2 * i)), max_new_tokens=5 + 3 * i)) for i in range(3)]
  engine.run()
  return [s.tokens for s in seqs], [s.raw_logprobs for s in seqs], engine.programs


def test_padding_rows_to_the_floor_changes_no_output():
  tokens1, logp1, programs1 = _run(1)
  tokens4, logp4, programs4 = _run(8)  # the floor is capped at the engine's own row bucket (4)
  assert tokens1 == tokens4
  for a, b in zip(logp1, logp4):
    np.testing.assert_allclose(a, b, atol=1e-5)
  assert {k[1] for k in programs1} >= {1} and {k[1] for k in programs4} == {4}


def test_decode_programs_are_evicted_least_recently_used_first(monkeypatch):
  _, params, config = tiny_llama()
  engine = Engine(params, config, max_rows=4, num_pages=64, page_size=4, dtype=jnp.float32, eos_ids=(),
                  chunk_size=4, min_row_bucket=1)
  from fineflax.engine.processors import RowFilters
  monkeypatch.setattr(programs_mod, "_PROGRAMS", programs_mod.collections.OrderedDict())
  monkeypatch.setattr(programs_mod, "MAX_PROGRAMS", 2)
  f = RowFilters(False)
  a = engine._decode_program(1, 32, 4, f)
  engine._decode_program(2, 32, 4, f)
  assert engine._decode_program(1, 32, 4, f) is a  # a hit: `a` becomes the most recent
  engine._decode_program(4, 32, 4, f)  # evicts the least recently used: rows 2, not rows 1
  assert [k[1] for k in programs_mod._PROGRAMS] == [1, 4]


@pytest.mark.fast
def test_row_and_page_buckets():
  assert [row_bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]
  assert [row_bucket(n, 8) for n in (1, 3, 8, 9)] == [8, 8, 8, 16]
  assert default_min_row_bucket("cpu") == 1 and default_min_row_bucket("gpu") == 8
  for n in range(1, 3000):
    for steps in (2, 4, 8):
      b = geometric_bucket(n, steps)
      assert b >= n and (n < 2 * steps or b <= (1 + 1 / steps) * n), (n, steps, b)
    p = 1 << (n - 1).bit_length()  # page_bucket: the next 2^k or 3 * 2^(k-1)
    assert page_bucket(n) == (3 * p // 4 if p >= 4 and 3 * p // 4 >= n else p)


@pytest.mark.fast
def test_pool_pages_stay_put_across_steps(monkeypatch):
  monkeypatch.setattr(session, "_RECENT_POOLS", [])
  rs = np.random.default_rng(0)
  sizes = []
  for _ in range(50):  # 64 rows, prompts of ~250 +- 30 tokens, 1000 tokens of room each
    lengths = [int(x) + 1000 for x in rs.normal(250, 30, 64)]
    need = sum(-(-n // 16) + 1 for n in lengths) + 1
    size = session.engine_pool_pages(lengths, 16)
    assert need <= size <= 1.25 * need
    sizes.append(size)
  assert len(set(sizes)) <= 2 and sizes.count(sizes[0]) >= 40
  assert session.engine_pool_pages([100] * 4, 16) == 36  # a much smaller need (33) gets its own bucket


@pytest.mark.fast
def test_released_compiled_memory_drops_programs_and_engines_compile_again(monkeypatch):
  from conftest import release_compiled_memory
  _, params, config = tiny_llama()
  engine = Engine(params, config, max_rows=2, num_pages=16, page_size=4, dtype=jnp.float32, eos_ids=(),
                  chunk_size=4, min_row_bucket=1)
  monkeypatch.setattr(programs_mod, "_PROGRAMS", programs_mod.collections.OrderedDict())
  from fineflax.engine.processors import RowFilters
  a = engine._decode_program(1, 16, 4, RowFilters(False))
  assert not release_compiled_memory(limit_bytes=1 << 60)  # under the limit: nothing is dropped
  assert len(programs_mod._PROGRAMS) == 1
  assert release_compiled_memory(limit_bytes=0)  # the suite's clean-up path, run for real
  assert len(programs_mod._PROGRAMS) == 0
  assert engine._decode_program(1, 16, 4, RowFilters(False)) is not a  # compiled again on next use
