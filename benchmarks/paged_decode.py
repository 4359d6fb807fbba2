"""Microbenchmark of paged decode attention at the Llama-3.1-8B shape: fineflax's kernel
(`fineflax.models.paged_decode`) over its block parameters vs the gather path and JAX's Pallas kernel.

  python -m benchmarks.paged_decode --out $OUT                  # GPU: one H200, about 3-5 minutes
  python -m benchmarks.paged_decode --smoke --out /tmp/pd       # CPU check: tiny shape, interpreted

Rows x Hq 32 / Hkv 8 / Dh 128 queries, one a row, every row `--context` tokens long (positions context - 1),
pages of `--page-sizes` tokens scattered at random over a pool of `--layers` layers (as the engine's).
Each timed call runs the attention of `--reps` layers in a `lax.fori_loop` (layer i % layers: each
layer's pages leave the cache before they are read again), so us/layer = call time / reps excludes the
dispatch. GB/s = live KV bytes a layer (rows x context x Hkv x Dh x 2 bytes x 2 for k, v) / us; "x copy"
= GB/s / the copy bandwidth of a jitted `x + 1` (read + write) measured in the same process. Each
variant runs in try/except: a failing one is printed and recorded, the others go on. Results go to
--out as paged_decode.json and paged_decode.md after every variant.
"""
from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import sys
import time

from benchmarks import gpu
from benchmarks._results import markdown_table
from fineflax.io import atomic_write_json, atomic_write_text

FULL = dict(hq=32, hkv=8, dh=128, context=1152, layers=4, reps=32, copy_gib=2.0)
SMOKE = dict(hq=8, hkv=2, dh=16, context=40, layers=2, reps=2, copy_gib=1 / 64)


def sweep(rows: int, smoke: bool) -> list[dict]:
  """fineflax kernel block parameters to time: the full grid at many rows, splits alone at few rows."""
  if smoke:
    return [dict(pages_per_block=2, splits=1, num_warps=4, num_stages=2),
            dict(pages_per_block=1, splits=2, num_warps=4, num_stages=2)]
  if rows >= 32:
    grid = itertools.product((2, 4, 8, 16), (1, 2, 4), (4, 8), (2, 3))
  else:
    grid = itertools.product((4, 8), (1, 2, 4, 8, 16), (4,), (2,))
  return [dict(pages_per_block=p, splits=s, num_warps=w, num_stages=st) for p, s, w, st in grid]


def _case(shape: dict, rows: int, page_size: int):
  import jax.numpy as jnp
  import numpy as np
  n = -(-shape["context"] // page_size)
  per_layer = rows * n + 1  # page 0: the trash page
  rng = np.random.default_rng(0)
  table = np.stack([1 + rng.permutation(rows * n)[:n] for _ in range(rows)]).astype(np.int32)
  pool_shape = (shape["hkv"], shape["layers"] * per_layer, page_size, shape["dh"])
  pool_k = jnp.asarray(rng.standard_normal(pool_shape, np.float32), jnp.bfloat16)
  pool_v = jnp.asarray(rng.standard_normal(pool_shape, np.float32), jnp.bfloat16)
  q = jnp.asarray(rng.standard_normal((rows, 1, shape["hq"], shape["dh"]), np.float32), jnp.bfloat16)
  positions = jnp.full((rows, 1), shape["context"] - 1, jnp.int32)
  return q, pool_k, pool_v, jnp.asarray(table), positions


def _timed(attend, args, layers: int, reps: int) -> float:
  """Seconds a layer: `reps` layers of attend(q, pool_k, pool_v, table, positions, layer) in one call."""
  import jax
  import jax.numpy as jnp
  from jax import lax

  @jax.jit
  def call(q, pk, pv, table, positions):
    def body(i, acc):
      return acc + attend(q, pk, pv, table, positions, i % layers).astype(jnp.float32)
    return lax.fori_loop(0, reps, body, jnp.zeros(q.shape, jnp.float32))

  call(*args).block_until_ready()
  best = float("inf")
  for _ in range(5):
    t = time.perf_counter()
    call(*args).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return best / reps


def run(args) -> dict:
  import jax
  from fineflax.models.paged import paged_attention
  from fineflax.models.paged_decode import DecodeKernel
  shape = SMOKE if args.smoke else FULL
  shape = dict(shape, context=args.context or shape["context"])
  bw = gpu.jax_copy_bandwidth(int(shape["copy_gib"] * gpu.GIB))
  out = {"device": gpu.jax_device_name(), "copy_bw": bw, "shape": shape, "rows": []}
  scale = shape["dh"] ** -0.5
  for page_size in [int(p) for p in args.page_sizes.split(",")]:
    for rows in [int(r) for r in args.rows.split(",")]:
      case = _case(shape, rows, page_size)
      kv_bytes = rows * shape["context"] * shape["hkv"] * shape["dh"] * 2 * 2
      nl = shape["layers"]
      variants = [("gather", {}, "gather"), ("jax-pallas", {}, "pallas")]
      variants += [("fineflax", p, DecodeKernel(**p)) for p in sweep(rows, args.smoke)]
      for name, params, kernel in variants:
        def attend(q, pk, pv, table, positions, layer, kernel=kernel):
          return paged_attention(q, pk, pv, layer, table, positions, None, scale, None, num_layers=nl, kernel=kernel)
        row = {"variant": name, "page_size": page_size, "rows": rows, **params}
        try:
          sec = _timed(attend, case, nl, shape["reps"])
          row.update(us=1e6 * sec, gbps=kv_bytes / sec / 1e9, x_copy=kv_bytes / sec / bw)
        except Exception as e:  # noqa: BLE001 - a failing variant is reported, the sweep goes on
          row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        _write(out, pathlib.Path(args.out))
      del case
  return out


def table(res: dict) -> str:
  head = (f"Device: {res['device']}. Copy bandwidth {res['copy_bw'] / 1e12:.2f} TB/s (read + write). Shape "
          f"{json.dumps(res['shape'])}. us a layer; GB/s of live KV; x copy = GB/s / copy bandwidth.\n\n")
  rows = []
  best = {}
  for r in res["rows"]:
    key = (r["page_size"], r["rows"])
    if "us" in r and r["variant"] == "fineflax" and r["us"] < best.get(key, {"us": float("inf")})["us"]:
      best[key] = r
    rows.append([r["variant"], r["page_size"], r["rows"], r.get("pages_per_block", "-"), r.get("splits", "-"),
                 r.get("num_warps", "-"), r.get("num_stages", "-"), r.get("us", "error"), r.get("gbps", "-"),
                 r.get("x_copy", "-"), r.get("error", "")[:100]])
  notes = [f"- best fineflax at page size {p}, {n} rows: ppb {b['pages_per_block']}, splits {b['splits']}, "
           f"warps {b['num_warps']}, stages {b['num_stages']}: {b['us']:.1f} us ({b['x_copy']:.2f} x copy)"
           for (p, n), b in best.items()]
  return head + markdown_table(["variant", "page", "rows", "ppb", "splits", "warps", "stages", "us", "GB/s",
                                "x copy", "error"], rows) + "\n\n" + "\n".join(notes) + "\n"


def _write(res: dict, out: pathlib.Path) -> None:
  out.mkdir(parents=True, exist_ok=True)
  atomic_write_json(out / "paged_decode.json", res, indent=1)
  atomic_write_text(out / "paged_decode.md", "### Paged decode attention (benchmarks/paged_decode.py)\n\n" + table(res))


def main(argv=None) -> int:
  import os
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"))
  ap.add_argument("--rows", default="64,8", help="batch sizes (rows), comma-separated")
  ap.add_argument("--page-sizes", default="16", help="page sizes, comma-separated (the engine's default: 16)")
  ap.add_argument("--context", type=int, default=None, help="tokens a row (default 1152; smoke 40)")
  ap.add_argument("--smoke", action="store_true", help="tiny shape on the CPU (kernel interpreted)")
  args = ap.parse_args(argv)
  if args.smoke:
    args.rows = "3"
    args.page_sizes = "4"
  res = run(args)
  print(table(res))
  return 0


if __name__ == "__main__":
  sys.exit(main())
