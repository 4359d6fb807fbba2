"""NF4 products x [M, K] @ W [K, N]: every kernel variant (fineflax.quant.nf4_gemv) vs XLA vs a bf16 W, same GPU.

  python -m benchmarks.nf4_gemv                      # products, then the decode steps (two parts, ~10 min)
  python -m benchmarks.nf4_gemv --only products      # one H200, <= ~5 min: the table and the sweep
  python -m benchmarks.nf4_gemv --only decode --models 1B   # decode steps (8B: --models 8B)
  python -m benchmarks.nf4_gemv --smoke              # CPU, tiny shapes, kernel interpreted

Products (one worker process): per (K, N) of the 1B, 8B and 70B-TP=2-shard linears and M in ROWS, one jitted
call computes x @ W_i for R distinct random weights W_i (R so the R weights hold >= 256 MB: L2 never holds
them), timed as the median of 3 runs of `calls` calls; us = time per product. GB/s = bytes read of one
W as stored (NF4: codes + uint8 absmax + nested f32 scales; bf16: 2 B a weight) / us; "copy" = the fraction
of the copy bandwidth measured in the same process (`gpu.jax_copy_bandwidth`). Variants: "bf16 W", "xla"
(`x @ W.dequantize(bf16)`) and the kernel variants of `candidates(M, K, N)`; each is compiled and checked
against XLA's product (max rel err); a failing one is recorded and the rest go on. The fastest kernel of
each (K, N, M) that beats XLA becomes an entry of nf4_kernel_table.json under --out (copy it to
fineflax/quant/ to commit it; `fineflax.quant.nf4_kernel_table`); the K-major kernel's best of each, or "xla"
where XLA's product was faster, an entry of nf4_kmajor_table.json. A table an earlier run (same device) left in
--out keeps its other entries, so runs over different rows / shapes add up to one table. Results stream to --out
as they arrive: nf4_gemv.json, nf4_gemv.md (this run's), nf4_kernel_table.json, nf4_kmajor_table.json.

Decode (`benchmarks/_nf4_decode.py`): ms per decode step through `SamplerSession` for bf16 linears, NF4 via
XLA and NF4 with FINEFLAX_NF4_KERNEL=auto reading the table just written (FINEFLAX_NF4_TABLE), at 1B / 8B
shapes and batch 1, 16, 64.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time

from benchmarks import gpu
from benchmarks._results import markdown_table
from fineflax.quant.nf4_kernel_table import TABLE_PATH

SHAPES = {  # name: (K, N)
    "1B q/o": (2048, 2048), "1B k/v": (2048, 512), "1B gate/up": (2048, 8192), "1B down": (8192, 2048),
    "1B q|k|v": (2048, 3072), "1B gate|up": (2048, 16384),  # the fused K-major groups the unrolled decoder runs
    "8B q/o": (4096, 4096), "8B k/v": (4096, 1024), "8B gate/up": (4096, 14336), "8B down": (14336, 4096),
    "8B q|k|v": (4096, 6144), "8B gate|up": (4096, 28672),
    "70B/2 q": (8192, 4096), "70B/2 k/v": (8192, 512), "70B/2 gate/up": (8192, 14336),
    "70B/2 down": (14336, 8192), "70B/2 o": (4096, 8192)}
SMOKE_SHAPES = {"tiny [256, 128]": (256, 128), "tiny [512, 192]": (512, 192)}
ROWS = (1, 16, 64, 128, 256)
TARGET_BYTES = 256 << 20
SMS = 132


def nf4_bytes(k: int, n: int) -> int:
  """Bytes the kernel reads of one NF4 W: codes (K N / 2) + uint8 absmax (K N / 64) + f32 nested scales."""
  blocks = k * n // 64
  return k * n // 2 + blocks + 4 * -(-blocks // 256) + 4


def kmajor_bytes(k: int, n: int) -> int:
  """Bytes the K-major kernel reads of one W: codes (K N / 2) + f32 scales (4 K N / 64)."""
  return k * n // 2 + 4 * (k * n // 64)


def kmajor_candidates(m: int, k: int, n: int) -> list:
  """K-major kernel variants tried for one (M, K, N): the default and a few neighbours that fit the shape."""
  from fineflax.quant.nf4_kmajor_gemv import DEFAULT_MAX_ROWS, DOT_MAX_ROWS, default_config, unsupported_reason
  from fineflax.quant.nf4_kmajor import NF4KMajor
  base = default_config(min(m, DEFAULT_MAX_ROWS), k, n) if m <= DOT_MAX_ROWS else None
  if base is None:
    return []
  old = dict(decode="gather", bkb=64, iters=4) if base.path == "fma" else dict(decode="gather")  # last default
  # K spans a program of 1 to 8 tiles (the dot default: 4): fewer split-K partials [S, rows, N] f32 to write and sum
  # (at 64 rows and one 128-byte tile a program they outweigh the codes: 8B down, S = 56)
  if base.path == "fma":
    more = [dict(bkb=256, iters=1), dict(bkb=64, iters=4), dict(bkb=64, iters=4, num_warps=2), dict(bn=128), old,
            dict(bn=128, iters=4)]
  elif m <= DEFAULT_MAX_ROWS:  # dot_t: last measured (1.05-1.15x slower) before the scales came in as vectors
    more = [dict(bn=128), dict(iters=1), dict(bn=128, iters=1), dict(bkb=64, iters=2), old, dict(path="dot_t"),
            dict(path="dot_t", bn=128), dict(path="dot_t", bn=128, iters=1), dict(path="deq"), dict(iters=8),
            dict(bn=128, iters=8), dict(path="dot_t", iters=8)]
    if m <= 8:  # the fma path up to its 8 rows: the shuffle decode left it a row's FMAs (no tile padded to 16)
      more += [dict(path="fma"), dict(path="fma", bkb=64, iters=2)]
  else:  # rollout rows: more outputs a program (x re-read N / bn times), more warps for the [rows, bn] accumulator;
    # deq: the planes written once, then cuBLAS
    more = [dict(bn=128), dict(num_warps=8), dict(bn=128, num_warps=8), dict(bkb=64, iters=2, num_warps=8),
            dict(path="deq"), dict(path="deq", bn=128), dict(path="deq", bkb=64, iters=4),
            dict(iters=4, num_warps=8), dict(bn=128, iters=4, num_warps=8), dict(iters=8, num_warps=8)]
  # Triton's software pipelining of the tile loop (num_stages; every table entry so far ran unpipelined): the next
  # tiles' codes in flight while one decodes, where a program loops over more than one tile
  more += [dict(num_stages=2), dict(num_stages=3), dict(iters=8, num_stages=3)]
  w = NF4KMajor.abstract(k, n)
  fits = lambda c: unsupported_reason((m, k), w, c) is None and not (c.num_stages > 1 and c.iters == 1)
  out = [base] + [c for c in (dataclasses.replace(base, **kw) for kw in more) if fits(c)]
  return list(dict.fromkeys(out))


def _entries(path: pathlib.Path, device: str) -> dict:
  """The entries of a table an earlier run wrote on the same device kind; {} if none (or another device)."""
  if not path.exists():
    return {}
  old = json.loads(path.read_text())
  return old.get("entries", {}) if old.get("device") == device else {}


def _split_for(programs: int, k: int, bk: int) -> int:
  """Least power-of-2 split-K that gives >= 2 programs an SM, K divisible, at most 16."""
  s = 1
  while programs * s < 2 * SMS and s < 16 and k % (bk * s * 2) == 0:
    s *= 2
  return s


def candidates(m: int, k: int, n: int, smoke: bool = False):
  """The kernel variants tried for one (M, K, N): a bounded sweep (decode method, path, tiles, split-K)."""
  from fineflax.quant.nf4_gemv import KernelConfig
  pow2 = 1 << max(0, (m - 1).bit_length())
  out = []
  if m <= 8:
    for bn in (64, 128):
      for split in sorted({1, _split_for(n // bn, k, 128)}):
        out.append(KernelConfig(path="fma", bm=pow2, bn=bn, bk=128, split_k=split))
    out.append(KernelConfig(path="fma", bm=pow2, bn=64, bk=64, split_k=_split_for(n // 64, k, 64), num_warps=2))
    out.append(KernelConfig(decode="select", path="fma", bm=pow2, bn=64, bk=128, split_k=_split_for(n // 64, k, 128)))
  if m >= 2:
    bm = min(max(pow2, 16), 64)
    for bn in (64, 128):
      mt = -(-m // bm)
      for split in sorted({1, _split_for(mt * n // bn, k, 64)}):
        out.append(KernelConfig(bm=bm, bn=bn, bk=64, split_k=split))
    if m >= 64:
      out.append(KernelConfig(bm=min(pow2, 128), bn=128, bk=64, num_warps=8))
    out.append(KernelConfig(decode="select", bm=bm, bn=64, bk=64, split_k=_split_for(-(-m // bm) * n // 64, k, 64)))
  if smoke:
    out = [dataclasses.replace(c, bk=min(c.bk, 64), split_k=1) for c in out[:2]]
  return [c for c in out if n % c.bn == 0 and k % (c.bk * c.split_k) == 0]


def random_nf4(key, k: int, n: int):
  """A random NF4Tensor [K, N] (uniform codes, random nested scales): the stored layout, without quantising."""
  import jax
  import jax.numpy as jnp
  from fineflax.quant.nf4 import NF4Tensor
  blocks = k * n // 64
  kc, ka, ks = jax.random.split(key, 3)
  return NF4Tensor(codes=jax.random.randint(kc, (k * n // 2,), 0, 256, jnp.int32).astype(jnp.uint8),
                   absmax=jax.random.randint(ka, (blocks,), 0, 256, jnp.int32).astype(jnp.uint8),
                   absmax_scale=0.01 + 0.01 * jax.random.uniform(ks, (-(-blocks // 256),), jnp.float32),
                   absmax_offset=jnp.float32(0.02), shape=(k, n), dtype=jnp.dtype(jnp.bfloat16))


def _time(fn, args, calls: int) -> float:
  import jax
  sync = lambda: jax.block_until_ready(fn(*args))
  return statistics.median(gpu.time_steps(lambda: fn(*args), calls, sync) / calls for _ in range(3))


def products_worker(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from fineflax.quant import nf4_kernel_table
  from fineflax.quant.nf4_gemv import nf4_matmul
  from fineflax.quant.nf4_kmajor import from_nf4
  from fineflax.quant.nf4_kmajor_gemv import kmajor_matmul

  out = pathlib.Path(spec["out"])
  out.mkdir(parents=True, exist_ok=True)
  interpret, smoke = spec["smoke"], spec["smoke"]
  copy_bw = 0.0 if smoke else gpu.jax_copy_bandwidth(1 << 30)
  result = {"device": gpu.jax_device_name(), "jax": jax.__version__, "copy_gb_s": copy_bw / 1e9, "rows": []}
  # the tables of an earlier run into the same --out keep their entries (this run's replace the same keys)
  table, ktable = ({"device": result["device"], "jax": jax.__version__,
                    "entries": _entries(out / name, result["device"])}
                   for name in ("nf4_kernel_table.json", "nf4_kmajor_table.json"))
  wanted = spec.get("variants")
  t_start = time.perf_counter()

  def keep(name):
    return not wanted or any(w in name for w in wanted)

  def flush():
    (out / "nf4_gemv.json").write_text(json.dumps(result, indent=1))
    (out / "nf4_kernel_table.json").write_text(json.dumps(table, indent=1))
    (out / "nf4_kmajor_table.json").write_text(json.dumps(ktable, indent=1))
    (out / "nf4_gemv.md").write_text(report(result))

  weights = {}  # shape: (keys, NF4 weights, bf16 weights or None), made once
  for m, (shape, (k, n)) in ((m, sk) for m in spec["rows"] for sk in spec["shapes"].items()):  # M first
    if shape not in weights:
      reps = 2 if smoke else max(2, min(64, -(-TARGET_BYTES // nf4_bytes(k, n))))
      keys = jax.random.split(jax.random.key(k * 7 + n), reps)
      weights[shape] = [keys, [random_nf4(kk, k, n) for kk in keys], None]
    keys, nf4, dense = weights[shape][:3]
    reps = len(keys)
    if time.perf_counter() - t_start > spec["budget_s"]:
      result["rows"].append({"shape": shape, "k": k, "n": n, "m": m, "variant": "-", "error": "time budget spent"})
      continue
    x = jax.random.normal(jax.random.key(m), (m, k), jnp.float32).astype(jnp.bfloat16)
    variants = {"xla": None, **({"bf16 W": None} if keep("bf16 W") else {})}
    variants.update({c.name(): c for c in kmajor_candidates(m, k, n) if keep(c.name())})  # the K-major kernel
    variants.update({cfg.name(): cfg for cfg in candidates(m, k, n, smoke) if keep(cfg.name())})
    ref, best, kbest, rows = None, None, None, {}
    for name, cfg in variants.items():
      row = {"shape": shape, "k": k, "n": n, "m": m, "variant": name}
      try:
        if name == "bf16 W":
          if dense is None:
            dense = weights[shape][2] = [(0.02 * jax.random.normal(kk, (k, n), jnp.float32)).astype(jnp.bfloat16)
                                         for kk in keys]
          fn, ws, nbytes = jax.jit(lambda x, ws: [x @ w for w in ws]), dense, 2 * k * n
        elif name == "xla":
          fn, ws, nbytes = jax.jit(lambda x, ws: [x @ w.dequantize(jnp.bfloat16) for w in ws]), nf4, nf4_bytes(k, n)
        elif name.startswith("kmajor"):
          if len(weights[shape]) == 3:
            weights[shape].append([from_nf4(w) for w in nf4])
          fn = jax.jit(lambda x, ws, cfg=cfg: [kmajor_matmul(x, w, jnp.bfloat16, cfg, interpret=interpret) for w in ws])
          ws, nbytes = weights[shape][3], kmajor_bytes(k, n)
        else:
          fn = jax.jit(lambda x, ws, cfg=cfg: [nf4_matmul(x, w, jnp.bfloat16, cfg, interpret=interpret) for w in ws])
          ws, nbytes = nf4, nf4_bytes(k, n)
        t0 = time.perf_counter()
        got = np.asarray(fn(x, ws)[0], np.float32)
        row["compile_s"] = time.perf_counter() - t0
        if name == "xla":
          ref = got
        elif name != "bf16 W" and ref is not None:
          row["max_rel_err"] = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
        sec = _time(fn, (x, ws), spec["calls"]) / reps
        row.update(us=1e6 * sec, gb_s=nbytes / sec / 1e9, copy_frac=(nbytes / sec / copy_bw) if copy_bw else None)
        if name.startswith("kmajor") and row.get("max_rel_err", 1.0) < 2 ** -6 and (
            kbest is None or row["us"] < kbest[0]["us"]):
          kbest = (row, cfg)
        bnb_kernel = cfg is not None and not name.startswith("kmajor")
        if bnb_kernel and row.get("max_rel_err", 1.0) < 2 ** -6 and (best is None or row["us"] < best[0]["us"]):
          best = (row, cfg)
      except Exception as e:  # one failing variant keeps the others
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
      rows[name] = row
      result["rows"].append(row)
      print(json.dumps(row), file=sys.stderr, flush=True)
    xla_us = rows.get("xla", {}).get("us")
    if best is not None and xla_us is not None and best[0]["us"] < xla_us:
      entry = dict(dataclasses.asdict(best[1]), us=best[0]["us"], xla_us=xla_us, measured_m=m)
      table["entries"][nf4_kernel_table.key(k, n, nf4_kernel_table.bucket(m))] = entry
    if kbest is not None:  # the K-major kernel's best, or "xla" where XLA's product was faster
      slower = xla_us is not None and xla_us < kbest[0]["us"]
      ktable["entries"][nf4_kernel_table.key(k, n, nf4_kernel_table.bucket(m))] = dict(
          {"path": "xla"} if slower else dataclasses.asdict(kbest[1]), us=kbest[0]["us"], xla_us=xla_us, measured_m=m)
    flush()
  result["table_path"] = str(out / "nf4_kernel_table.json")
  flush()
  return result


def report(result: dict) -> str:
  """Markdown: per (shape, M) every variant, and a summary of the best kernel vs XLA and bf16."""
  rows, summary = [], {}
  for r in result["rows"]:
    if "error" in r:
      rows.append([r["shape"], r["m"], r["variant"], "error: " + r["error"][:90], "", "", "", ""])
      continue
    rows.append([r["shape"], r["m"], r["variant"], f"{r['us']:.1f}", f"{r['gb_s']:.0f}",
                 "-" if r.get("copy_frac") is None else f"{r['copy_frac']:.2f}", f"{r.get('compile_s', 0):.1f}",
                 "-" if r.get("max_rel_err") is None else f"{r['max_rel_err']:.1e}"])
    s = summary.setdefault((r["shape"], r["m"]), {})
    kind = r["variant"] if r["variant"] in ("xla", "bf16 W") else "kmajor" if r["variant"].startswith("kmajor") \
        else "kernel"
    if kind != "kernel" or r.get("max_rel_err", 1.0) < 2 ** -6:
      if kind not in s or r["us"] < s[kind]["us"]:
        s[kind] = r
  best = []
  for (shape, m), s in summary.items():
    kern, xla, bf16, kmaj = s.get("kernel"), s.get("xla"), s.get("bf16 W"), s.get("kmajor")
    ratio = lambda a, b: "-" if a is None or b is None else f"{a['us'] / b['us']:.2f}"
    frac = lambda r: "-" if r is None or r.get("copy_frac") is None else f"{r['copy_frac']:.2f}"
    best.append([shape, m, "-" if kern is None else kern["variant"], "-" if kern is None else f"{kern['us']:.1f}",
                 frac(kern), ratio(xla, kern), ratio(bf16, kern), "-" if kmaj is None else f"{kmaj['us']:.1f}",
                 frac(kmaj), ratio(xla, kmaj), ratio(bf16, kmaj)])
  head = (f"Device: {result.get('device')}, jax {result.get('jax')}, copy bandwidth "
          f"{result.get('copy_gb_s', 0):.0f} GB/s (same process).")
  return "\n".join([
      "## NF4 products: fused kernel variants vs XLA vs bf16 W (benchmarks/nf4_gemv.py)", "", head, "",
      "Best bnb-layout kernel and the K-major kernel per product (copy = its GB/s over the copy bandwidth; "
      "> 1 ratios: the kernel is faster):", "",
      markdown_table(["product", "M", "best bnb-layout kernel", "us", "copy", "xla / it", "bf16 W / it",
                      "K-major us", "copy", "xla / K-major", "bf16 W / K-major"], best), "", "Every variant:", "",
      markdown_table(["product", "M", "variant", "us", "GB/s", "copy", "compile s", "max rel err vs xla"], rows)])


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--smoke", action="store_true")
  ap.add_argument("--only", choices=("products", "decode"))
  ap.add_argument("--variants", default="", help="comma-separated substrings: only variants whose name has one "
                  "(e.g. 'fma,bn128'; 'xla' always runs)")
  ap.add_argument("--shapes", default="", help="comma-separated substrings of product names (e.g. '8B,70B')")
  ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="M values of the products")
  ap.add_argument("--models", default="1B,8B", help="decode shapes: 1B, 8B")
  ap.add_argument("--batches", default="1,16,64", help="decode batch sizes")
  ap.add_argument("--weights", default="bf16,nf4-xla,nf4-auto,nf4-kmajor", help="decode: which linears (of "
                  "bf16, nf4-xla, nf4-auto, nf4-kmajor), in this order")
  ap.add_argument("--budget-s", type=float, default=300.0, help="products: stop starting new (shape, M) after this")
  ap.add_argument("--table", default="", help="decode: the table FINEFLAX_NF4_KERNEL=auto reads (default: the "
                  "one this run wrote under --out, else the committed one)")
  ap.add_argument("--out", default=os.environ.get("OUT", str(pathlib.Path(__file__).with_name("out"))))
  ap.add_argument("--merge", nargs="+", metavar="TABLE", help="merge nf4_kernel_table.json files of several "
                  "calls (later files win per key) into --out/nf4_kernel_table.json, and exit")
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  args = ap.parse_args()
  from benchmarks._nf4_decode import decode_weights
  try:
    decode_weights(args.weights)
  except ValueError as e:
    ap.error(str(e))
  if args.merge:
    tables = [json.loads(pathlib.Path(t).read_text()) for t in args.merge]
    merged = dict(tables[-1], entries={k: v for t in tables for k, v in t["entries"].items()})
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(args.out) / "nf4_kernel_table.json").write_text(json.dumps(merged, indent=1))
    print(f"{len(merged['entries'])} entries -> {args.out}/nf4_kernel_table.json")
    return
  if args.worker:
    spec = json.loads(args.worker)
    if spec["part"] == "products":
      gpu.print_result(products_worker(spec))
    else:
      from benchmarks._nf4_decode import decode_worker
      gpu.print_result(decode_worker(spec))
    return
  env = gpu.jax_env(JAX_PLATFORMS="cpu") if args.smoke else gpu.jax_env()
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  if args.only in (None, "products"):
    shapes = SMOKE_SHAPES if args.smoke else {
        k: v for k, v in SHAPES.items() if not args.shapes or any(s in k for s in args.shapes.split(","))}
    spec = {"part": "products", "smoke": args.smoke, "shapes": shapes, "out": str(out),
            "rows": [1, 3, 16] if args.smoke else [int(r) for r in args.rows.split(",")],
            "calls": 2 if args.smoke else 10, "budget_s": args.budget_s,
            "variants": [v for v in args.variants.split(",") if v]}
    res = gpu.run_worker([*gpu.worker_argv(__spec__.name), "--worker", json.dumps(spec)], env=env, timeout=900)
    if "error" in res:
      print("products worker:", res["error"], file=sys.stderr)
    md = (out / "nf4_gemv.md").read_text() if (out / "nf4_gemv.md").exists() else ""
    print(md)
  if args.only in (None, "decode"):
    from benchmarks._nf4_decode import run_decode
    fresh = out / "nf4_kernel_table.json"
    table = args.table or str(fresh if fresh.exists() else pathlib.Path(TABLE_PATH))
    kfresh = out / "nf4_kmajor_table.json"
    print(run_decode(args, env, table, out, str(kfresh) if kfresh.exists() else ""))


if __name__ == "__main__":
  main()
