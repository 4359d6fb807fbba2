"""Where the engine's decode step goes (default: the Llama-3.1-8B shape, `--shape`): device time per kernel category,
device busy vs wall time, host time between chunks; per paged attention kernel, the static cache as reference.

  python -m benchmarks.profile_engine --out $OUT                        # GPU: one H200, about 3-4 minutes
  python -m benchmarks.profile_engine --smoke --out /tmp/pe             # CPU check: tiny shape

Per variant (--variants, default static,gather,paged_decode), in its own subprocess (JAX without
preallocation; XLA command buffers off so each kernel keeps its HLO op; --command-buffers keeps XLA's
default): random bf16 weights, --rows rows of --prompt-len-token prompts prefilled, then --new tokens decoded
(a ~1k-token context). "gather" / "paged_decode": `Engine` (paged cache, the prompts held, then resumed,
as benchmarks/engine.py case a); "static": `SamplerSession(cache="static")`. The decode runs once untimed,
once timed (wall ms/step), once under `jax.profiler.trace`. Device kernels are put in one category each by
their HLO op in the compiled decode program (engine variants; the static session's by kernel name only,
so its attention einsums count as matmul there):

  attention    the kernel (`fineflax_paged_decode*`, JAX's `paged_attention*`) or ops under the named scope
               `paged_attention` (models/paged.py: the gather path's page gather and its einsums)
  kv write     ops under the scope `kv_write` (the pool scatter), scatter / dynamic-update-slice kernels
  matmul       GEMMs (cuBLAS, Triton GEMM fusions, dots) of the linears and the logits
  sampling     ops under the scope `sampling` (engine/device.py: per-row keys and `sample_rows`)
  copies       copy / transpose / slices / memcpy / memset
  other        everything else (norms, rope, activations, loop bookkeeping)

busy = the time at least one kernel runs (each kernel once) / steps; idle = wall - busy. Host time between
chunks = the gaps between consecutive device executions of the decode program (XLA Modules line) in the traced run, per step.
Writes DIR/profile_engine.json and DIR/profile_engine.md after every variant.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import pathlib
import sys
import tempfile

from benchmarks import gpu
from benchmarks._decode_timing import hold_prompts, resume_rows, static_decode, static_session, static_start
from benchmarks._results import markdown_table
from fineflax.io import atomic_write_json, atomic_write_text

CATEGORIES = ("matmul", "attention", "kv write", "sampling", "copies", "other")
FULL = dict(shape="Llama-3.1-8B", rows=64, prompt_len=1024, new=64)
SMOKE = dict(shape="tiny", rows=4, prompt_len=24, new=8)
NO_GRAPHS = " --xla_gpu_enable_command_buffer="


def category(op: str, kernel: str, hlo: dict) -> str:
  """One of CATEGORIES (rules in the module docstring) for a kernel launched by HLO op `op`: by the named
  scope in its metadata op_name (`kv_write`, `paged_attention` in models/paged.py, `sampling` in
  engine/device.py), else by kernel name and opcode."""
  from benchmarks.profile_step import _op_name_meta, categorize
  info = hlo.get(op, {})
  scope, k, opcode = _op_name_meta(info.get("line", "")), kernel.lower(), info.get("opcode", "")
  if "fineflax_paged_decode" in k or "paged_attention" in k:
    return "attention"
  if "kv_write" in scope or "scatter" in k or "dynamic_update_slice" in k or opcode == "scatter":
    return "kv write"
  if "paged_attention" in scope:
    return "attention"
  if "sampling" in scope:
    return "sampling"
  base = categorize(op, kernel, hlo)
  return base if base in ("matmul", "copies") else "other"


def read_trace(path: str) -> tuple[list, list]:
  """(kernels [(op, kernel name, start ns, duration ns)], module executions [(start ns, end ns)]).

  A kernel is kept once however many stream lines of the trace show it (newer profilers list a kernel on
  its stream's line and on aggregate lines: summing every line counted each kernel several times), and the
  "XLA Modules" line is read from whichever plane holds it (the device's or the host's)."""
  import jax
  data = jax.profiler.ProfileData.from_file(path)
  gpus = [p for p in data.planes if p.name.startswith("/device:GPU")]
  planes = gpus or [p for p in data.planes if p.name.startswith("/host:CPU")]
  kernels, modules, seen = [], set(), set()
  for plane in data.planes:
    for line in plane.lines:
      if line.name == "XLA Modules":
        modules.update((ev.start_ns, ev.start_ns + ev.duration_ns) for ev in line.events)
  for plane in planes:
    for line in plane.lines:
      if line.name in ("XLA Modules", "XLA Ops", "Steps", "XLA TraceMe") or (gpus and not line.name.startswith("Stream")):
        continue
      for ev in line.events:
        op = dict(ev.stats).get("hlo_op")
        if op is None and not gpus:
          continue
        key = (ev.name, ev.start_ns, ev.duration_ns)
        if key in seen:
          continue
        seen.add(key)
        kernels.append((str(op or ev.name), ev.name, float(ev.start_ns), float(ev.duration_ns)))
  return kernels, sorted(modules)


def busy_ns(kernels: list) -> float:
  """Time at least one kernel runs: the union of the kernels' [start, start + duration) intervals."""
  total, end = 0.0, float("-inf")
  for _, _, start, ns in sorted(kernels, key=lambda k: k[2]):
    if start + ns > end:
      total += start + ns - max(start, end)
      end = start + ns
  return total


def _decode_hlo() -> dict:
  """{instruction: info} of every compiled engine decode program (`engine.programs`)."""
  from benchmarks.profile_step import parse_hlo
  from fineflax.engine import programs
  hlo = {}
  for key, program in list(programs._PROGRAMS.items()):
    if len(key) > 1 and isinstance(key[1], int):  # decode chunks: (signature, rows, width, eos, filters)
      hlo.update(parse_hlo(program.as_text()))
  return hlo


def worker(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  from benchmarks.engine import _engine, _prompts, _setup
  config, params, wbytes, kv, bw = _setup(spec)
  rows, plen, new, variant = spec["rows"], spec["prompt_len"], spec["new"], spec["variant"]
  prompts = _prompts(rows, plen, config.vocab_size)
  if variant == "static":
    session = static_session(params, config, new, spec["chunk_size"])
    prefill = lambda: static_start(session, prompts)
    decode_held = lambda _: static_decode(session, new)
    hlo_of = lambda: {}
  else:
    from fineflax.engine.decode import decode_impl, prepare_decode_params
    params = prepare_decode_params(params, config, decode_impl("auto"), jnp.bfloat16)
    engine = _engine(params, config, spec, max_rows=rows, lengths=[plen + new] * rows, attention=variant,
                     prepared=True)
    prefill = lambda: hold_prompts(engine, prompts, new)
    decode_held = lambda seqs: resume_rows(engine, seqs, new)
    hlo_of = _decode_hlo
  run = lambda: decode_held(prefill())  # (decode wall s, steps), the prefill untimed
  run()
  wall, steps = run()
  live_kv = rows * kv * (plen + (new - 1) / 2)
  out = {"variant": variant, "device": gpu.jax_device_name(), "bw": bw, "steps": steps,
         "wall_ms": 1e3 * wall / steps, "read_ms": 1e3 * (wbytes + live_kv) / bw}
  with tempfile.TemporaryDirectory() as trace_dir:
    held = prefill()  # the prompts' prefill stays out of the trace: every traced kernel is a decode step's
    with jax.profiler.trace(trace_dir):
      traced, tsteps = decode_held(held)
    kernels, modules = read_trace(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[0])
  hlo = hlo_of()
  cats, by_op = collections.Counter(), collections.defaultdict(lambda: [0.0, 0])
  for op, name, _, ns in kernels:
    cats[category(op, name, hlo)] += ns
    by_op[(op, name[:50])][0] += ns
    by_op[(op, name[:50])][1] += 1
  busy = busy_ns(kernels)
  decode = [m for m in modules if m[1] - m[0] > 0]
  gaps = [b[0] - a[1] for a, b in zip(decode, decode[1:]) if b[0] > a[1]]
  out.update(traced_wall_ms=1e3 * traced / tsteps, busy_ms=busy / 1e6 / tsteps, kernels_per_step=len(kernels) / tsteps,
             module_runs=len(decode), host_gap_ms=sum(gaps) / 1e6 / tsteps, hlo_ops=len(hlo),
             by_category_ms={c: cats.get(c, 0.0) / 1e6 / tsteps for c in CATEGORIES},
             top=[{"op": op, "kernel": k, "ms_per_step": ns / 1e6 / tsteps, "per_step": cnt / tsteps}
                  for (op, k), (ns, cnt) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:12]])
  return out


def table(results: list[dict]) -> str:
  ok = [r for r in results if "error" not in r]
  head = ""
  if ok:
    head = (f"Device: {ok[0]['device']}. Copy BW {ok[0]['bw'] / 1e12:.2f} TB/s; read bound (weights + mean live "
            f"KV) {ok[0]['read_ms']:.2f} ms/step. ms per decode step.\n\n")
  rows = []
  for r in results:
    if "error" in r:
      rows.append([r["variant"], "error"] + ["-"] * (6 + len(CATEGORIES)) + [r["error"][:160]])
      continue
    rows.append([r["variant"], r["wall_ms"], r["wall_ms"] / r["read_ms"], r["traced_wall_ms"], r["busy_ms"],
                 r["traced_wall_ms"] - r["busy_ms"], r["host_gap_ms"], r["kernels_per_step"]]
                + [r["by_category_ms"][c] for c in CATEGORIES] + [""])
  md = markdown_table(["variant", "wall", "/ read", "traced wall", "busy", "idle", "host between chunks",
                       "kernels"] + list(CATEGORIES) + ["error"], rows)
  tops = []
  for r in ok:
    tops.append(f"\nTop ops, {r['variant']}:\n")
    tops += [f"- {t['ms_per_step']:.4f} ms/step, {t['per_step']:.1f}x: {t['op'][:60]} {t['kernel']}" for t in r["top"]]
  return head + md + "\n" + "\n".join(tops) + "\n"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"))
  ap.add_argument("--variants", default="static,gather,paged_decode")
  ap.add_argument("--shape", default=None, help="a shape of benchmarks._engine_common.SHAPES (default Llama-3.1-8B; "
                  "Qwen2.5-1.5B: the GRPO rollout of benchmarks/tunix_grpo.py, with --rows 256 --prompt-len 64 "
                  "--new 256)")
  ap.add_argument("--rows", type=int, default=None)
  ap.add_argument("--prompt-len", type=int, default=None)
  ap.add_argument("--new", type=int, default=None, help="decode steps (default 64: two chunks of 32)")
  ap.add_argument("--chunk-size", type=int, default=32)
  ap.add_argument("--page-size", type=int, default=16)
  ap.add_argument("--command-buffers", action="store_true", help="keep XLA's command buffers (CUDA graphs)")
  ap.add_argument("--timeout", type=float, default=300.0, help="seconds per variant subprocess")
  ap.add_argument("--smoke", action="store_true", help="tiny shape on the CPU")
  ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.worker:
    gpu.print_result(worker(json.loads(args.worker)))
    return 0
  base = SMOKE if args.smoke else FULL
  spec = dict(base, shape=args.shape or base["shape"], rows=args.rows or base["rows"],
              prompt_len=args.prompt_len or base["prompt_len"],
              new=args.new or base["new"], chunk_size=args.chunk_size, page_size=args.page_size,
              copy_bytes=int((1 / 64 if args.smoke else 2.0) * gpu.GIB))
  extra = {"JAX_PLATFORMS": "cpu"} if args.smoke else {}
  env = gpu.jax_env(**extra)
  if not args.command_buffers and not args.smoke:
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + NO_GRAPHS
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  results = []
  for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
    res = gpu.run_worker([*gpu.worker_argv(__spec__.name), "--worker", json.dumps(dict(spec, variant=variant))],
                         env=env, timeout=args.timeout)
    res.setdefault("variant", variant)
    results.append(res)
    md = f"### Engine decode step profile (benchmarks/profile_engine.py)\n\n{table(results)}"
    atomic_write_json(out / "profile_engine.json", results, indent=1)
    atomic_write_text(out / "profile_engine.md", md)
    print(json.dumps({k: v for k, v in res.items() if k != "top"}), flush=True)
  print(md)
  return 0


if __name__ == "__main__":
  sys.exit(main())
