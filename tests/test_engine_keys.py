"""Host threefry keys equal jax.random's bit for bit: PRNGKey of seeds up to 2**63 (with and without 64-bit
integers), fold_in of any 32-bit data."""
import jax
import numpy as np
import pytest

from fineflax.engine.keys import MASK, fold_in, row_keys, seed_key, wide_key

pytestmark = pytest.mark.fast


def test_host_keys_equal_jax_random():
  rng = np.random.default_rng(0)
  seeds = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 5, 2**63 - 1]
  seeds += [int(s) for s in rng.integers(0, 2**63 - 1, size=6, dtype=np.int64)]
  for seed in seeds:
    key = jax.random.PRNGKey(seed)
    assert list(seed_key(seed)) == np.asarray(key).tolist(), seed
    for i in (0, 1, 7, 2**31 + 3, 2**32 - 1):
      assert list(fold_in(seed_key(seed), i)) == np.asarray(jax.random.fold_in(key, i)).tolist(), (seed, i)
  want = np.stack([np.asarray(jax.random.fold_in(jax.random.PRNGKey(99), i)) for i in range(5)])
  assert row_keys(99, 5).dtype == np.uint32 and (row_keys(99, 5) == want).all()


def test_with_64_bit_integers_the_seed_keeps_its_high_word():
  with jax.enable_x64(True):
    for seed in (5, 2**32 + 5, 2**63 - 1):
      assert list(seed_key(seed)) == np.asarray(jax.random.PRNGKey(seed)).tolist()
  assert seed_key(2**32 + 5, x64=True) != seed_key(2**32 + 5, x64=False)


def test_wide_keys_keep_all_64_bits_without_x64():
  assert not jax.config.jax_enable_x64
  for a, b in ((5, 5 + 2**32), (-1, 2**32 - 1), (7, 7 + 2**40), (0, 2**63), (-(2**63), 0)):
    assert wide_key(a) != wide_key(b), (a, b)
  for seed in (0, 5, 2**32 - 1):  # small seeds: the key they always had
    assert list(wide_key(seed)) == np.asarray(jax.random.PRNGKey(seed)).tolist()
  with jax.enable_x64(True):  # int64 seeds: jax's own x64 key
    for seed in (2**32 + 5, 2**63 - 1, -1, -(2**40), -(2**63)):
      assert list(wide_key(seed)) == np.asarray(jax.random.PRNGKey(seed)).tolist(), seed
  assert wide_key(-1) == (MASK, MASK) and wide_key(2**64 - 1) == (MASK, MASK)
  assert (row_keys(-1, 2, wide=True) == np.array([fold_in((MASK, MASK), i) for i in range(2)])).all()
  for bad in (2**64, -(2**63) - 1):
    with pytest.raises(ValueError, match=f"seed={bad}"):
      wide_key(bad)
