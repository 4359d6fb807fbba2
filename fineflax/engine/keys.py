"""Threefry key data on the host, bit for bit what `jax.random` gives, without a device call.

    seed_key(seed)          == key_data(jax.random.PRNGKey(seed))
    fold_in(key, i)         == key_data(jax.random.fold_in(key, i))
    row_keys(seed, n)       the n keys fold_in(PRNGKey(seed), i), uint32 [n, 2]
    wide_key(seed)          all 64 bits of any seed in [-2**63, 2**64), x64 or not (the server's seeds)

The server derives a key per sampled row of every request; through `jax.random` that is a few eager device
ops and a device-to-host copy each (~0.7 ms a request on a CPU backend, and on a GPU a synchronisation)
on the engine thread, between decode chunks: a burst of 128 requests held the device idle for ~0.1 s.
Here: ~12 us a key in Python integers.

Threefry-2x32 (Salmon et al. 2011, 20 rounds), as `jax._src.prng.threefry2x32`: key (k0, k1), k2 = k0 ^ k1 ^
0x1BD11BDA; x += (k0, k1); five groups of four rounds (x0 += x1; x1 = rotl(x1, r) ^ x0) with rotations
(13, 15, 26, 6) / (17, 29, 16, 24) alternating, after group g: x0 += k[(g+1) % 3], x1 += k[(g+2) % 3] + g + 1.
PRNGKey(seed) = (seed >> 32, seed & 0xFFFFFFFF) with 64-bit integers enabled, else (0, seed & 0xFFFFFFFF);
fold_in(key, i) = threefry2x32(key, (0, i)). Without x64 PRNGKey keeps only a seed's low 32 bits, so a
server's seeds 5 and 5 + 2**32 would draw the same text: `wide_key` is PRNGKey's x64 key of the seed taken
modulo 2**64 (negative seeds as two's complement: -1 is 2**64 - 1), whatever jax's setting; for seeds in
[0, 2**32) it equals PRNGKey(seed) either way.
"""
from __future__ import annotations

import numpy as np

MASK = 0xFFFFFFFF
ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(k0: int, k1: int, x0: int, x1: int) -> tuple[int, int]:
  """One threefry-2x32 block of the counter (x0, x1) under key (k0, k1) (module docstring)."""
  ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
  x0, x1 = (x0 + ks[0]) & MASK, (x1 + ks[1]) & MASK
  for g in range(5):
    for r in ROTATIONS[g % 2]:
      x0 = (x0 + x1) & MASK
      x1 = (((x1 << r) | (x1 >> (32 - r))) & MASK) ^ x0
    x0 = (x0 + ks[(g + 1) % 3]) & MASK
    x1 = (x1 + ks[(g + 2) % 3] + g + 1) & MASK
  return x0, x1


def seed_key(seed: int, x64: bool | None = None) -> tuple[int, int]:
  """The data of jax.random.PRNGKey(seed) (threefry); x64: jax's jax_enable_x64 (None: read it)."""
  if x64 is None:
    import jax
    x64 = bool(jax.config.jax_enable_x64)
  seed = int(seed)
  return ((seed >> 32) & MASK if x64 else 0), seed & MASK


SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # seeds `wide_key` takes: int64 or uint64


def wide_key(seed: int) -> tuple[int, int]:
  """(high word, low word) of seed mod 2**64 (module docstring); ValueError outside SEED_RANGE."""
  seed = int(seed)
  if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
    raise ValueError(f"seed={seed}: must be in [-2**63, 2**64 - 1]")
  seed %= 1 << 64
  return seed >> 32, seed & MASK


def fold_in(key: tuple[int, int], data: int) -> tuple[int, int]:
  """The data of jax.random.fold_in(key, data) for a threefry key's data and data < 2**32."""
  return threefry2x32(int(key[0]), int(key[1]), 0, int(data) & MASK)


def row_keys(seed: int, n: int, wide: bool = False) -> np.ndarray:
  """uint32 [n, 2]: fold_in(PRNGKey(seed), i) for i < n (wide: fold_in(wide_key(seed), i))."""
  key = wide_key(seed) if wide else seed_key(seed)
  return np.array([fold_in(key, i) for i in range(n)], np.uint32).reshape(n, 2)
