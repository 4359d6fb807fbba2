"""Which NF4 products run the fused kernel (`fineflax.quant.nf4_gemv`) under FINEFLAX_NF4_KERNEL=auto.

The table is measured, not assumed: `python -m benchmarks.nf4_gemv` times XLA's `x @ W.dequantize()` and
every kernel variant per (K, N) product and M, and writes `nf4_kernel_table.json` (this folder) with the
fastest kernel variant of each (K, N, M bucket) where it beats XLA. A missing file or entry means XLA.

FINEFLAX_NF4_TABLE names another table file (the benchmark's fresh one). The K-major kernel
(`nf4_kmajor_gemv`) has its own table, `nf4_kmajor_table.json` (FINEFLAX_NF4_KMAJOR_TABLE), same keys, its
`KMajorConfig` fields as values (`kmajor_choice`).

  key "K x N / M bucket": M bucket = the least of BUCKETS >= M (M > 256: none, XLA)
  value: the `KernelConfig` fields of the winning variant, plus "us" and "xla_us" as measured.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os

from fineflax.quant.nf4_gemv import KernelConfig

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FMA_MAX_ROWS = 4  # an FMA entry serves at most this many rows (H200, 8B products: at M = 4 it took 0.70-0.81x
                  # XLA's time, at M = 8 1.6-1.9x; RESULTS.md session_2026_11_28d)
TABLE_PATH = os.path.join(os.path.dirname(__file__), "nf4_kernel_table.json")
KMAJOR_TABLE_PATH = os.path.join(os.path.dirname(__file__), "nf4_kmajor_table.json")


def bucket(m: int) -> int | None:
  """The least bucket >= m rows, None above the largest (or for m < 1)."""
  return next((b for b in BUCKETS if b >= m), None) if m >= 1 else None


def key(k: int, n: int, m_bucket: int) -> str:
  return f"{k}x{n}/{m_bucket}"


@functools.lru_cache(maxsize=None)
def load_table(path: str | None = None) -> dict:
  """{key: entry} from the JSON table (default FINEFLAX_NF4_TABLE, else TABLE_PATH); {} when it does not exist."""
  path = path or os.environ.get("FINEFLAX_NF4_TABLE") or TABLE_PATH
  return _read(path)


@functools.lru_cache(maxsize=None)
def _read(path: str) -> dict:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)["entries"]


def kernel_choice(k: int, n: int, m: int, table: dict | None = None) -> KernelConfig | None:
  """The measured winner for x [m, k] @ NF4 [k, n], or None (XLA).

  The entry of m's bucket, else of the nearest smaller bucket that has one (the benchmark measures M = 1,
  16, 64, 128, 256), its rows bm raised to cover m in one tile (pow2(m); at most FMA_MAX_ROWS on the FMA path,
  which then serves m <= FMA_MAX_ROWS only, and 128 on the dot path). No entry at or below m's bucket: None.
  """
  table = load_table() if table is None else table
  b = bucket(m)
  entry = next((table[key(k, n, c)] for c in reversed(BUCKETS) if b is not None and c <= b
                and key(k, n, c) in table), None)
  if entry is None:
    return None
  cfg = KernelConfig(**{f: entry[f] for f in KernelConfig.__dataclass_fields__ if f in entry})
  if cfg.path == "fma" and m > FMA_MAX_ROWS:
    return None
  rows = min(1 << (m - 1).bit_length(), FMA_MAX_ROWS if cfg.path == "fma" else 128)
  return dataclasses.replace(cfg, bm=max(cfg.bm, rows))


def kmajor_choice(k: int, n: int, m: int, table: dict | None = None):
  """The measured `KMajorConfig` for x [m, k] @ NF4KMajor [k, n]: the entry of m's bucket, else of the nearest
  smaller bucket that has one (an "fma" entry only for m <= max(FMA_MAX_ROWS, the entry's bucket): one measured
  at 8 rows serves 5-8; an "xla" entry: None); no usable entry: `nf4_kmajor_gemv.default_config`. Past
  DEFAULT_MAX_ROWS only an entry of a bucket past it serves (a configuration measured at 64 rows is not assumed
  for 200); past the largest bucket (prefill) only its entry, and only a "deq" one (any rows); else None (XLA)."""
  from fineflax.quant import nf4_kmajor_gemv as km
  if table is None:
    table = _read(os.environ.get("FINEFLAX_NF4_KMAJOR_TABLE") or KMAJOR_TABLE_PATH)
  config = lambda e: km.KMajorConfig(**{f: e[f] for f in km.KMajorConfig.__dataclass_fields__ if f in e})
  b = bucket(m)
  if b is None:
    entry = table.get(key(k, n, BUCKETS[-1])) if m > BUCKETS[-1] else None
    return config(entry) if entry is not None and entry.get("path") == "deq" else None
  for c in reversed(BUCKETS):
    usable = c <= b and (m <= km.DEFAULT_MAX_ROWS or c > km.DEFAULT_MAX_ROWS)
    entry = table.get(key(k, n, c)) if usable else None
    if entry is not None and entry.get("path") == "xla":
      return None
    if entry is not None and (entry.get("path") != "fma" or m <= max(km.FMA_MAX_ROWS, c)):
      return config(entry)
  return km.default_config(m, k, n)
