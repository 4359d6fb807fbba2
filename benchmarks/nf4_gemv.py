"""NF4 products with few rows (decoding): the fused Pallas kernel vs `x @ W.dequantize()` vs a bf16 W, same GPU.

  python -m benchmarks.nf4_gemv           # GPU, ~3 min; writes the "nf4_gemv" section of RESULTS.md
  python -m benchmarks.nf4_gemv --smoke   # CPU, tiny shapes, kernel interpreted; prints only

Part 1, per Llama-3.2-1B linear shape and M rows: one jitted call computes x @ W_i for 8 distinct random
kernels W_i (so the weights are read 8 times per call, no reuse), timed as the median of 5 runs of 20 calls;
GB/s = bytes of the 8 kernels as stored (bf16: 2 B a weight; NF4: codes + double-quantised scales) over the
time. Variants: bf16 W; NF4 through XLA (`x @ W.dequantize(bf16)`, the default); NF4 through
`fineflax.quant.nf4_gemv.nf4_matmul` (FINEFLAX_NF4_KERNEL=pallas in the decode runs). max rel err: the fused result against XLA's NF4 product.
Part 2: the decode step of the whole 1B shape (random weights, `SamplerSession`, unrolled decoder, greedy,
32-token prompt, 64 new tokens; step ms = decode(64) wall time / 64, median of 3) for bf16 weights, NF4 with
XLA's product and NF4 with the fused kernel (--decode-only: NF4 decoded from its dense copy,
`SamplerSession(dense_base=True)`, instead), each in its own process; same tokens: that run's greedy tokens
against the XLA NF4 run's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


from benchmarks import gpu
from benchmarks._results import markdown_table, write_section

SHAPES = {"q/o [2048, 2048]": (2048, 2048), "k/v [2048, 512]": (2048, 512), "gate/up [2048, 8192]": (2048, 8192),
          "down [8192, 2048]": (8192, 2048)}
SMOKE_SHAPES = {"tiny [256, 128]": (256, 128)}
ROWS = (1, 16, 64)
N_KERNELS = 8


def micro_worker(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from fineflax.quant import quantize_nf4
  from fineflax.quant.nf4_gemv import nf4_matmul

  interpret = spec["smoke"]
  rows = []
  for name, (k, n) in spec["shapes"].items():
    keys = jax.random.split(jax.random.key(0), N_KERNELS)
    dense = [(0.02 * jax.random.normal(kk, (k, n), jnp.float32)).astype(jnp.bfloat16) for kk in keys]
    nf4 = [quantize_nf4(w.astype(jnp.float32), 64, True) for w in dense]
    nf4_bytes = sum(sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(w)) for w in nf4)
    variants = {
        "bf16 W": (jax.jit(lambda x, ws: [x @ w for w in ws]), dense, 2 * k * n * N_KERNELS),
        "NF4, XLA dequantise + dot": (jax.jit(lambda x, ws: [x @ w.dequantize(jnp.bfloat16) for w in ws]), nf4,
                                      nf4_bytes),
        "NF4, fused kernel": (jax.jit(lambda x, ws: [nf4_matmul(x, w, interpret=interpret) for w in ws]), nf4,
                              nf4_bytes)}
    for m in spec["rows"]:
      x = jax.random.normal(jax.random.key(m), (m, k), jnp.float32).astype(jnp.bfloat16)
      ref = None
      for variant, (fn, ws, nbytes) in variants.items():
        try:
          out = fn(x, ws)
          jax.block_until_ready(out)
          runs = [gpu.time_steps(lambda: fn(x, ws), spec["calls"], lambda: jax.block_until_ready(fn(x, ws)))
                  / spec["calls"] for _ in range(5)]
          sec = statistics.median(runs)
          err = None
          if variant.startswith("NF4, XLA"):
            ref = np.stack([np.asarray(o, np.float32) for o in out])
          elif variant.startswith("NF4, fused") and ref is not None:
            got = np.stack([np.asarray(o, np.float32) for o in out])
            err = float(np.abs(got - ref).max() / np.abs(ref).max())
          rows.append({"shape": name, "rows": m, "variant": variant, "us": 1e6 * sec / N_KERNELS,
                       "gb_s": nbytes / sec / 1e9, "max_rel_err": err})
        except Exception as e:  # a variant that fails keeps the others
          rows.append({"shape": name, "rows": m, "variant": variant, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        print(rows[-1], file=sys.stderr, flush=True)
  return {"rows": rows, "device": gpu.jax_device_name(), "versions": {"jax": jax.__version__}}


def decode_worker(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from benchmarks._random_weights import random_params
  from benchmarks.qlora import MODELS, SMOKE_MODELS
  from fineflax.models import ModelConfig
  from fineflax.sampling import SamplerSession

  config = ModelConfig(**(SMOKE_MODELS if spec["smoke"] else MODELS)[spec["model"]])  # imported, not JSON: hashable
  params = random_params(config, "nf4" if spec["quant"] == "nf4" else "none", jax.random.key(0), jnp.bfloat16)
  n, b = spec["new_tokens"], spec["batch"]
  prompts = np.random.default_rng(0).integers(0, config.vocab_size, (b, 32)).tolist()
  out = {}
  times = []
  for i in range(4):  # the first run compiles
    s = SamplerSession(params, config, max_total_len=32 + n, temperature=0.0, eos_ids=(), dtype=jnp.bfloat16,
                       impl="unrolled", dense_base=spec.get("dense", False))
    s.start(prompts)
    jax.block_until_ready(s.cache)
    t = time.perf_counter()
    s.decode(n)
    dt = time.perf_counter() - t
    if i:
      times.append(dt)
    out["tokens"] = np.asarray(s.result(width=n).tokens).tolist()
  out.update(step_ms=1e3 * statistics.median(times) / n, device=gpu.jax_device_name())
  return out


def micro_report(micro: dict, command: str) -> str:
  table = []
  by = {(r["shape"], r["rows"], r["variant"]): r for r in micro["rows"]}
  for (shape, m, variant), r in by.items():
    bf16 = by.get((shape, m, "bf16 W"), {})
    ratio = f"{bf16['us'] / r['us']:.2f}" if "us" in r and "us" in bf16 else "-"
    table.append([shape, m, variant, *(["error: " + r["error"][:80], "", "", ""] if "error" in r else
                                       [f"{r['us']:.1f}", f"{r['gb_s']:.0f}", ratio,
                                        "-" if r["max_rel_err"] is None else f"{r['max_rel_err']:.1e}"])])
  return "\n".join([
      "## NF4 products with few rows: fused kernel vs XLA (benchmarks/nf4_gemv.py)", "",
      f"Device: {micro.get('device')}. Command: `{command}`. jax {micro.get('versions', {}).get('jax')}." +
      (f" Worker error: {micro['error'][:300]}" if "error" in micro else ""), "",
      "Per product: us = time of one x @ W (8 distinct kernels per jitted call); GB/s = the kernels' stored "
      "bytes over that time; bf16/this = the same product on a bf16 W over this one (> 1: faster than bf16).",
      "", markdown_table(["kernel", "rows", "variant", "us", "GB/s", "bf16/this", "max rel err vs XLA NF4"], table)])


def decode_report(decodes: dict, batch: int) -> str:
  import numpy as np
  rows = []
  base = decodes.get("bf16", {}).get("step_ms")
  xla_tokens = decodes.get("nf4-xla", {}).get("tokens")
  for name, r in decodes.items():
    if "error" in r:
      rows.append([name, "error: " + r["error"][:80], "", ""])
      continue
    same = ("-" if name not in ("nf4-fused", "nf4-dense") or xla_tokens is None else
            f"{np.mean(np.array(r['tokens']) == np.array(xla_tokens)):.3f}")
    rows.append([name, f"{r['step_ms']:.3f}", "-" if base is None else f"{base / r['step_ms']:.2f}", same])
  device = next((r["device"] for r in decodes.values() if "device" in r), "?")
  return "\n".join([f"Decode step, Llama-3.2-1B shape (random weights), unrolled decoder, batch {batch} ({device}):", "",
                    markdown_table(["weights", "step ms", "bf16 step / this", "same greedy tokens as NF4 via XLA"],
                                   rows)])


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--smoke", action="store_true")
  ap.add_argument("--batches", default="1,16", help="decode batch sizes of part 2")
  ap.add_argument("--decode-only", action="store_true", help="part 2 only, with the dense-copy variant too")
  ap.add_argument("--section", default="nf4_gemv", help="RESULTS.md section to write")
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    spec = json.loads(args.worker)
    gpu.print_result(micro_worker(spec) if spec["part"] == "micro" else decode_worker(spec))
    return
  command = " ".join(["python -m benchmarks.nf4_gemv"] + sys.argv[1:])
  env = gpu.jax_env(JAX_PLATFORMS="cpu") if args.smoke else gpu.jax_env()
  if args.decode_only:
    md = f"## NF4 decode step: NF4 base vs its dense copy (benchmarks/nf4_gemv.py --decode-only)\n\nCommand: `{command}`."
    variants = (("bf16", "none", "xla", False), ("nf4-xla", "nf4", "xla", False), ("nf4-dense", "nf4", "xla", True))
  else:
    spec = {"part": "micro", "smoke": args.smoke, "shapes": SMOKE_SHAPES if args.smoke else SHAPES,
            "rows": [1, 16] if args.smoke else list(ROWS), "calls": 2 if args.smoke else 20}
    micro = gpu.run_worker([*gpu.worker_argv(__spec__.name), "--worker", json.dumps(spec)], env=env)
    md = micro_report(dict({"rows": []}, **micro), command)
    variants = (("bf16", "none", "xla", False), ("nf4-xla", "nf4", "xla", False), ("nf4-fused", "nf4", "pallas", False))
  if not args.smoke:
    write_section(args.section, md)
  for batch in [int(b) for b in args.batches.split(",")]:
    decodes = {}
    for name, quant, kernel, dense in variants:
      if args.smoke and name == "nf4-fused":
        continue  # the Triton kernel needs a GPU (interpret mode is covered by part 1 and the tests)
      dspec = {"part": "decode", "smoke": args.smoke, "model": "Llama-2-7B" if args.smoke else "Llama-3.2-1B",
               "quant": quant, "new_tokens": 8 if args.smoke else 64, "batch": batch, "dense": dense}
      decodes[name] = gpu.run_worker([*gpu.worker_argv(__spec__.name), "--worker", json.dumps(dspec)],
                                      env=dict(env, FINEFLAX_NF4_KERNEL=kernel))
      print(name, batch, {k: v for k, v in decodes[name].items() if k != "tokens"}, file=sys.stderr, flush=True)
    md += "\n\n" + decode_report(decodes, batch)
    if not args.smoke:
      write_section(args.section, md)
  print(md)


if __name__ == "__main__":
  main()
