"""NF4 dequantisation on the GPU: how fast XLA runs each way of writing it, alone and in front of a matmul.

  python -m benchmarks.nf4_dequant           # GPU, ~1 min; writes the "nf4_dequant" section of RESULTS.md
  python -m benchmarks.nf4_dequant --smoke   # CPU, tiny shapes; prints only

Ways of writing W = NF4[q] * absmax (all bit-identical in bf16, checked in the run):
  current   NF4Tensor.dequantize: flat [nblocks, 64] view, 16-entry gather, double-quant absmax decoded inline
  2d        the same math on [K, N/64, 64] views of the row-major kernel (no flat reshape across rows)
  2d_select as 2d, with NF4[q] as a 4-level select tree on q's bits instead of a gather
Timed per Llama-3.2-1B kernel shape: dequantisation alone (GB/s = bytes read + bf16 bytes written over
time, against a measured copy), and x @ W / dy @ W^T with M = 4096 rows against the same product on a bf16
W, under XLA's default flags and with --xla_gpu_triton_gemm_any=true (lets XLA's Triton GEMM take the
dequantisation as its operand's prologue; "fused" = a compiled fusion holds both the u8 codes and the dot).
Each flag set runs in its own process; times are the median of 5 runs of 20 back-to-back calls.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys


from benchmarks import gpu
from benchmarks._results import markdown_table, write_section

SHAPES = {"gate/up [2048, 8192]": (2048, 8192), "down [8192, 2048]": (8192, 2048),
          "q/o [2048, 2048]": (2048, 2048)}
SMOKE_SHAPES = {"tiny [128, 256]": (128, 256)}
FLAGS = {"default": "", "triton_gemm_any": "--xla_gpu_triton_gemm_any=true"}
ROWS = 4096


def dequant_variants():
  import jax.numpy as jnp

  from fineflax.quant import NF4_CODE

  def absmax2d(t):
    k, n = t.shape
    return t.absmax_f32().reshape(k, n // t.blocksize)

  def nibbles(t):
    k, n = t.shape
    c = t.codes.reshape(k, n // 2)
    return jnp.stack([c >> 4, c & 15], axis=-1).reshape(k, n // t.blocksize, t.blocksize)

  def select_tree(q):
    level = [jnp.float32(v) for v in NF4_CODE]
    for bit in range(4):
      b = ((q >> bit) & 1).astype(bool)
      level = [jnp.where(b, level[2 * j + 1], level[2 * j]) for j in range(len(level) // 2)]
    return level[0]

  def two_d(t, lookup):
    k, n = t.shape
    return (lookup(nibbles(t)) * absmax2d(t)[..., None]).reshape(k, n).astype(jnp.bfloat16)

  gather = lambda q: jnp.asarray(NF4_CODE)[q.astype(jnp.int32)]
  return {"current": lambda t: t.dequantize(jnp.bfloat16),
          "2d": lambda t: two_d(t, gather),
          "2d_select": lambda t: two_d(t, select_tree)}


def fused_dot(hlo: str) -> bool:
  """A fused computation of the compiled module that reads u8 and holds a dot."""
  blocks = re.split(r"\n(?=\S)", hlo)
  return any(" dot(" in b and "u8[" in b and ("fused" in b.split("{", 1)[0] or "triton" in b) for b in blocks)


def median_ms(fn, *args, calls: int, repeats: int = 5) -> float:
  """Median over `repeats` of the ms per call of `calls` back-to-back calls (`gpu.time_steps`)."""
  import jax
  box = [fn(*args)]  # compile
  step = lambda: box.__setitem__(0, fn(*args))
  sync = lambda: jax.block_until_ready(box[0])
  return 1000 * statistics.median(gpu.time_steps(step, calls, sync) / calls for _ in range(repeats))


def worker(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from fineflax.quant import quantize_nf4

  variants = dequant_variants()
  rows, calls = spec["rows"], spec["calls"]
  big = jnp.ones((256 * 2 ** 20,), jnp.float32)  # 1 GiB copy: read + write
  copy = jax.jit(lambda a: a + 1)
  copy_bw = 2 * big.nbytes / (median_ms(copy, big, calls=5) / 1000)
  del big
  out = {"copy_GBps": copy_bw / 1e9, "cases": [], "device": gpu.jax_device_name(), "jax": jax.__version__}
  for name, (k, n) in spec["shapes"].items():
    w = 0.02 * jax.random.normal(jax.random.PRNGKey(0), (k, n), jnp.float32)
    t = quantize_nf4(w.astype(jnp.bfloat16))
    ref = np.asarray(t.dequantize(jnp.bfloat16).astype(jnp.float32))
    wb = jnp.asarray(ref, jnp.bfloat16)
    x = jax.random.normal(jax.random.PRNGKey(1), (rows, k), jnp.bfloat16)
    dy = jax.random.normal(jax.random.PRNGKey(2), (rows, n), jnp.bfloat16)
    nbytes = t.codes.nbytes + t.absmax.nbytes + t.absmax_scale.nbytes + 2 * k * n
    dense = {"fwd": median_ms(jax.jit(lambda x_, w_: x_ @ w_), x, wb, calls=calls),
             "bwd": median_ms(jax.jit(lambda d_, w_: d_ @ w_.T), dy, wb, calls=calls)}
    for vname, deq in variants.items():
      same = bool(np.array_equal(np.asarray(jax.jit(deq)(t).astype(jnp.float32)), ref))
      deq_ms = median_ms(jax.jit(deq), t, calls=calls)
      row = {"shape": name, "variant": vname, "identical": same, "dequant_ms": deq_ms,
             "dequant_GBps": nbytes / (deq_ms / 1000) / 1e9}
      for direction, fn, a in (("fwd", lambda x_, t_: x_ @ deq(t_), x), ("bwd", lambda d_, t_: d_ @ deq(t_).T, dy)):
        jf = jax.jit(fn)
        row[f"{direction}_ms"] = median_ms(jf, a, t, calls=calls)
        row[f"{direction}_bf16_ms"] = dense[direction]
        row[f"{direction}_fused"] = fused_dot(jf.lower(a, t).compile().as_text())
      out["cases"].append(row)
      print(json.dumps(row), file=sys.stderr, flush=True)
  return out


def report(results: dict, device: str, command: str) -> str:
  lines = ["## NF4 dequantisation on the GPU (benchmarks/nf4_dequant.py)", "",
           f"Device: {device}. Command: `{command}`. jax {next(iter(results.values())).get('jax', '?')}.", "",
           "x @ W and dy @ W^T: M = 4096 bf16 rows; ratio = the same product on a bf16 W / this one "
           "(1.00 = dequantisation free). GB/s: codes + scales read + bf16 written over the dequantisation "
           "alone, timed as separate jitted calls from Python, so small kernels are dispatch-bound (~0.06 ms a "
           "call) and the GB/s understate them; the x@W columns, one jitted call each, carry the real cost. "
           "fused: XLA compiled the dequantisation into the GEMM's operand.", ""]
  rows = []
  for flags, r in results.items():
    if "error" in r:
      lines.append(f"- {flags}: error {r['error'][:200]}")
      continue
    for c in r["cases"]:
      rows.append([flags, c["shape"], c["variant"], "yes" if c["identical"] else "**no**",
                   round(c["dequant_ms"], 4), round(c["dequant_GBps"]), round(r["copy_GBps"]),
                   round(c["fwd_ms"], 4), f"{c['fwd_bf16_ms'] / c['fwd_ms']:.2f}", "yes" if c["fwd_fused"] else "no",
                   round(c["bwd_ms"], 4), f"{c['bwd_bf16_ms'] / c['bwd_ms']:.2f}", "yes" if c["bwd_fused"] else "no"])
  lines.append(markdown_table(["XLA flags", "kernel", "dequant", "bf16-identical", "dequant ms", "GB/s",
                               "copy GB/s", "x@W ms", "bf16/this", "fused", "dy@W^T ms", "bf16/this", "fused"],
                              rows))
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU; print only")
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    gpu.print_result(worker(json.loads(args.worker)))
    return
  spec = {"shapes": SMOKE_SHAPES if args.smoke else SHAPES, "rows": 64 if args.smoke else ROWS,
          "calls": 2 if args.smoke else 20}
  results = {}
  for flags, value in FLAGS.items():
    if args.smoke and value:
      continue
    env = gpu.jax_env(JAX_PLATFORMS="cpu") if args.smoke else gpu.jax_env(XLA_FLAGS=value)
    results[flags] = gpu.run_worker([*gpu.worker_argv(__spec__.name), "--worker", json.dumps(spec)], env=env)
  command = " ".join(["python -m benchmarks.nf4_dequant"] + sys.argv[1:])
  md = report(results, gpu.device_name(), command)
  print(md)
  if not args.smoke:
    write_section("nf4_dequant", md)


if __name__ == "__main__":
  main()
