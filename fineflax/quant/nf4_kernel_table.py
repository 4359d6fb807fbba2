"""Which NF4 products run the fused kernel (`fineflax.quant.nf4_gemv`) under FINEFLAX_NF4_KERNEL=auto.

The table is measured, not assumed: `python -m benchmarks.nf4_gemv` times XLA's `x @ W.dequantize()` and
every kernel variant per (K, N) product and M, and writes `nf4_kernel_table.json` (this folder) with the
fastest kernel variant of each (K, N, M bucket) where it beats XLA. A missing file or entry means XLA.

FINEFLAX_NF4_TABLE names another table file (the benchmark's fresh one).

  key "K x N / M bucket": M bucket = the least of BUCKETS >= M (M > 256: none, XLA)
  value: the `KernelConfig` fields of the winning variant, plus "us" and "xla_us" as measured.
"""
from __future__ import annotations

import functools
import json
import os

from fineflax.quant.nf4_gemv import KernelConfig

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TABLE_PATH = os.path.join(os.path.dirname(__file__), "nf4_kernel_table.json")


def bucket(m: int) -> int | None:
  """The least bucket >= m rows, None above the largest (or for m < 1)."""
  return next((b for b in BUCKETS if b >= m), None) if m >= 1 else None


def key(k: int, n: int, m_bucket: int) -> str:
  return f"{k}x{n}/{m_bucket}"


@functools.lru_cache(maxsize=None)
def load_table(path: str | None = None) -> dict:
  """{key: entry} from the JSON table (default FINEFLAX_NF4_TABLE, else TABLE_PATH); {} when it does not exist."""
  path = path or os.environ.get("FINEFLAX_NF4_TABLE") or TABLE_PATH
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)["entries"]


def kernel_choice(k: int, n: int, m: int, table: dict | None = None) -> KernelConfig | None:
  """The measured winner for x [m, k] @ NF4 [k, n], or None (XLA) where the table has no entry."""
  b = bucket(m)
  entry = None if b is None else (load_table() if table is None else table).get(key(k, n, b))
  if entry is None:
    return None
  fields = {f: entry[f] for f in KernelConfig.__dataclass_fields__ if f in entry}
  return KernelConfig(**fields)
