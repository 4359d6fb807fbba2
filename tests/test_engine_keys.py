"""Host threefry keys equal jax.random's bit for bit: PRNGKey of seeds up to 2**63 (with and without 64-bit
integers), fold_in of any 32-bit data."""
import jax
import numpy as np
import pytest

from fineflax.engine.keys import fold_in, row_keys, seed_key

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
