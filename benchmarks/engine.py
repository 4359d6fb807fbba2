"""The generation engine (fineflax.engine: paged KV cache, continuous batching, shared prompts) at scale.

  python -m benchmarks.engine --out benchmarks/out/engine                       # GPU: cases a, b, c
  python -m benchmarks.engine --only b --baseline-path .baseline                # b against the old sampler
  python -m benchmarks.engine --only b --attention gather --admission reserve,watermark --pool-pages 0,6144
  python -m benchmarks.engine --only a --attention pallas                       # one case, one kernel
  python -m benchmarks.engine --tiny                                            # CPU check: tiny shapes
  python -m benchmarks.engine --only tp                                         # 4 GPUs: 70B shape, TP=4
  python -m benchmarks.engine --only tp --tp 2 --tp-nf4-kernel xla,pallas       # 2 GPUs: NF4 products both ways

Tables go to --out as engine_<case>.md (engine_<case>_<kernel>.md with one --attention kernel) and .json.

Random bf16 weights of a named shape (`_random_weights.random_params`), greedy decoding, EOS ignored
except where a case forces it; each case runs in its own subprocess (JAX without preallocation) and its
Markdown table is written to --out as soon as it ends. Bandwidth BW = 2 * bytes / time of a jitted `x + 1`
over --copy-gib GiB (read + write), measured in the case's own process. KV bytes per token = 2 (k, v) *
layers * kv heads * head dim * 2 (bf16); weight bytes = every parameter once (a tied embedding is the
output projection, read whole each step).

(a) cost follows the live tokens, not the allocation: Llama-3.1-8B shape, 64 rows of a 32-token prompt,
    1024 new tokens each; the pool and each row's reserve sized for 4096 vs 1024 new tokens ("room").
    ms/step = decode wall time (prefill excluded; programs compiled before, `Engine.precompile`) / steps;
    read ms/step = (weights + the live KV averaged over the steps) / BW. Targets: room 4096 <= 1.1x room
    1024; ms/step <= 1.3x read. One row per paged attention kernel (--attention, default both);
    --attention static adds the static-cache session (`SamplerSession(cache="static")`, cache sized for the
    room) as the reference the paged engine should match at room = need.
(b) long-tail rollouts: Llama-3.2-1B shape, 256 rows of a 128-token prompt, response lengths log-normal
    with median 512 (sigma --sigma) capped at 4096, each row ending at its drawn length (per-row
    max_new_tokens: the forced EOS). Wall time (prefill + decode, after an untimed run that compiles)
    vs the read bound: sum over decode steps s of (weights + KV of the rows still live at s) / BW.
    With --baseline-path DIR, the old static sampler (`fineflax.sampling.generate` imported from
    DIR/fineflax, a checkout of the starting commit) decodes the same prompts in its own subprocess: its
    cost does not depend on when rows end (every row attends the whole cache until the longest ends, and
    finished rows keep their slots), so it runs max(lengths) steps with EOS off. Its time is the second
    of two calls (--baseline-runs 2; with 1: one call's wall time minus the compile times JAX logs).
    Targets: wall <= 1.3x the read bound; >= 2.5x faster than the old sampler.
    One engine row per --attention kernel x (--admission, --pool-pages) pair (default: reserving admission
    with the pool that holds every row's whole reserve (0), and the watermark's with 6,144 pages, just above
    the ~5,400 live at the peak): generated tokens/s, that / the first pair's, rows in flight (decode rows
    a call: peak / mean), preemptions and recomputed tokens of the timed run. Target: >= 0.95x.
(c) shared prompts: Llama-3.2-1B shape, 128 prompts x 8 samples, 1024-token prompts, 16 new tokens:
    `submit(request, n=8)` (prefill once, pages shared) vs 1024 separate requests: tokens prefilled,
    pages holding prompt positions (after the samples' first token: full pages shared, the partial last
    page copied on write), prefill wall time. Target: 128 x 1023 tokens prefilled, about 1/8 the pages.
(tp) tensor-parallel decoding: Llama-3.1-70B shape (`fineflax.models.hub_shapes`), linears NF4 (QLoRA
    base; --tp-quant none: bf16), weights and pages split over a "model" mesh axis of --tp devices
    (`fineflax.engine.tensor_parallel`; random weights made directly in the split layout, never whole on one
    device), 32 rows of a 128-token prompt, 256 new tokens. ms/step as (a); per-device weight-read ms = the
    bytes of one device's weight shards / BW (BW of device 0). Target: ms/step <= 3x the per-device
    weight-read time. Peak memory per device.

Layout: the shapes and the workers' shared setup in benchmarks/_engine_common.py, case tp's worker in
benchmarks/_engine_tp.py, the tables in benchmarks/_engine_tables.py; cases a, b, c and the CLI here.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import pathlib
import sys
import time


from benchmarks import gpu
from benchmarks._decode_timing import time_decode, time_static
from benchmarks._engine_common import _engine, _prompts, _setup, response_lengths
from benchmarks._engine_tables import table_a, table_b, table_c, table_tp
from benchmarks._engine_tp import run_nf4_kernels, worker_tp
from benchmarks._results import write_section
from fineflax.io import atomic_write_json, atomic_write_text

FULL = {
    "a": dict(shape="Llama-3.1-8B", rows=64, prompt_len=32, new_tokens=1024, rooms=[4096, 1024]),
    "b": dict(shape="Llama-3.2-1B", rows=256, prompt_len=128, median=512, cap=4096, admissions=["reserve", "watermark"],
              pool_pages=[0, 6144]),
    "c": dict(shape="Llama-3.2-1B", prompts=128, samples=8, prompt_len=1024, new_tokens=16),
    "tp": dict(shape="Llama-3.1-70B", rows=32, prompt_len=128, new_tokens=256),
}
TINY = {
    "a": dict(shape="tiny", rows=4, prompt_len=8, new_tokens=48, rooms=[256, 64]),
    "b": dict(shape="tiny", rows=16, prompt_len=8, median=16, cap=64, admissions=["reserve", "watermark"],
              pool_pages=[0, 16]),
    "c": dict(shape="tiny", prompts=4, samples=4, prompt_len=40, new_tokens=4),
    "tp": dict(shape="tiny_tp", rows=4, prompt_len=8, new_tokens=16),
}
TITLES = {"a": "(a) cost follows the live tokens", "b": "(b) long-tail rollouts", "c": "(c) shared prompts",
          "tp": "(tp) tensor-parallel decoding"}
TINY_DEVICES = 4  # forced CPU devices of --tiny (case tp splits over --tp of them)


# ----------------------------------------------------------------------------- case workers

def worker_a(spec: dict) -> dict:
  import jax
  from fineflax.engine.decode import decode_impl, prepare_decode_params
  import jax.numpy as jnp
  config, raw, wbytes, kv, bw = _setup(spec)
  params = prepare_decode_params(raw, config, decode_impl(spec.get("impl", "auto")), jnp.bfloat16)
  rows, plen, n = spec["rows"], spec["prompt_len"], spec["new_tokens"]
  prompts = _prompts(rows, plen, config.vocab_size)
  live_kv = rows * kv * (plen + (n - 1) / 2)  # mean over the steps of the KV in the cache
  read_ms = 1e3 * (wbytes + live_kv) / bw
  out = {"device": gpu.jax_device_name(), "bw": bw, "weight_bytes": wbytes, "read_ms": read_ms, "rows": []}
  for attention in spec["attentions"]:
    for room in spec["rooms"]:
      try:
        if attention == "static":  # the static cache (`SamplerSession(cache="static")`) sized for `room`
          dt, steps = time_static(raw, config, prompts, n, room, spec["chunk_size"])
          out["rows"].append({"attention": attention, "room": room, "ms_step": 1e3 * dt / steps, "steps": steps,
                              "pool_gib": 0.0, "programs": "-", "compile_s": 0.0,
                              "peak_gib": (gpu.jax_peak_bytes() or 0) / gpu.GIB})
          gpu.print_result(out)
          continue
        engine = _engine(params, config, spec, max_rows=rows, lengths=[plen + room] * rows,
                         attention=attention, prepared=True)
        t = time.perf_counter()
        compiled = engine.precompile([rows], plen + n)
        compile_s = time.perf_counter() - t
        dt, steps = time_decode(engine, prompts, n, room)
        pool_gib = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(engine.pool)) / gpu.GIB
        out["rows"].append({"attention": attention, "room": room, "ms_step": 1e3 * dt / steps, "steps": steps,
                            "pool_gib": pool_gib, "programs": compiled, "compile_s": compile_s,
                            "peak_gib": (gpu.jax_peak_bytes() or 0) / gpu.GIB})
        del engine
      except Exception as e:  # noqa: BLE001 - reported in the table (e.g. the Pallas kernel on this GPU)
        out["rows"].append({"attention": attention, "room": room, "error": f"{type(e).__name__}: {str(e)[:300]}"})
      gc.collect()  # this room's cache goes before the next one is made (room 4096 ran out of memory)
      gpu.print_result(out)  # cumulative: a killed worker still leaves its rows
  return out


def worker_b(spec: dict) -> dict:
  import jax.numpy as jnp
  import numpy as np
  from fineflax.engine import Request
  from fineflax.engine.decode import decode_impl, prepare_decode_params
  config, params, wbytes, kv, bw = _setup(spec)
  params = prepare_decode_params(params, config, decode_impl(spec.get("impl", "auto")), jnp.bfloat16)
  lengths = response_lengths(spec["rows"], spec["median"], spec["cap"], spec["sigma"])
  plen = spec["prompt_len"]
  prompts = _prompts(spec["rows"], plen, config.vocab_size)
  steps = np.arange(max(lengths))
  lens = np.array(lengths)
  live = (lens[None, :] > steps[:, None])  # [steps, rows]: row still decoding at step s
  bound_s = float(((wbytes + kv * (live * (plen + steps[:, None])).sum(1)) / bw).sum())
  out = {"device": gpu.jax_device_name(), "bw": bw, "weight_bytes": wbytes, "lengths": lengths,
         "bound_s": bound_s, "rows": []}
  for attention in spec["attentions"]:
    for admission, pool in zip(spec["admissions"], spec["pool_pages"]):
      row = {"attention": attention, "admission": admission}
      try:
        engine = _engine(params, config, spec, max_rows=spec["rows"], lengths=[plen + n for n in lengths],
                         attention=attention, prepared=True, num_pages=pool, admission=admission)
        times = []
        for _ in range(2):  # the first run compiles the programs its buckets need
          t = time.perf_counter()
          seqs = [engine.submit(Request(p, max_new_tokens=n)) for p, n in zip(prompts, lengths)]
          before = dict(engine.stats)
          engine.run()
          times.append(time.perf_counter() - t)
          assert [len(s.tokens) for s in seqs] == lengths
        run = {k: engine.stats[k] - before[k] for k in ("decode_calls", "decode_rows", "preemptions",
                                                         "recomputed_tokens", "dispatch_s", "wait_s", "gap_s",
                                                         "gaps")}
        row.update(wall_s=times[-1], first_s=times[0], tokens_s=sum(lengths) / times[-1], **run,
                   mean_rows=run["decode_rows"] / max(run["decode_calls"], 1), peak_rows=engine.stats["peak_rows"],
                   programs=len(engine.programs), peak_pages=engine.stats["peak_pages"],
                   pool_pages=engine.pages.num_pages, peak_gib=(gpu.jax_peak_bytes() or 0) / gpu.GIB)
        del engine
      except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
      out["rows"].append(row)
      gpu.print_result(out)
  return out


def worker_baseline(spec: dict) -> dict:
  """The old static sampler on case b's prompts, imported from spec["baseline_path"]."""
  sys.path.insert(0, str(pathlib.Path(spec["baseline_path"]).resolve()))
  import fineflax
  import jax
  import jax.numpy as jnp
  from fineflax.sampling import generate
  jax.config.update("jax_log_compiles", True)
  compile_s = [0.0]

  class Timer(logging.Handler):
    def emit(self, record):
      msg = record.getMessage()
      if msg.startswith("Finished") and " in " in msg and msg.rstrip().endswith("sec"):
        compile_s[0] += float(msg.rsplit(" in ", 1)[1].split()[0])

  logging.getLogger("jax").addHandler(Timer())
  config, params, _, _, _ = _setup(spec)
  lengths = response_lengths(spec["rows"], spec["median"], spec["cap"], spec["sigma"])
  prompts = _prompts(spec["rows"], spec["prompt_len"], config.vocab_size)
  walls, compiles = [], []
  for _ in range(spec["baseline_runs"]):
    compile_s[0] = 0.0
    t = time.perf_counter()
    res = generate(params, config, prompts, max_new_tokens=max(lengths), temperature=0.0, eos_ids=(),
                   dtype=jnp.bfloat16)
    walls.append(time.perf_counter() - t)
    compiles.append(compile_s[0])
    assert res.mask.all()
  return {"device": gpu.jax_device_name(), "fineflax": fineflax.__file__, "walls": walls, "compiles": compiles,
          "steps": max(lengths), "peak_gib": (gpu.jax_peak_bytes() or 0) / gpu.GIB}


def worker_c(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  from fineflax.engine import Request
  from fineflax.engine.pages import pages_for
  from fineflax.engine.decode import decode_impl, prepare_decode_params
  config, params, _, _, _ = _setup(spec)
  params = prepare_decode_params(params, config, decode_impl(spec.get("impl", "auto")), jnp.bfloat16)
  k, plen, n = spec["samples"], spec["prompt_len"], spec["new_tokens"]
  prompts = _prompts(spec["prompts"], plen, config.vocab_size)
  out = {"device": gpu.jax_device_name(), "rows": []}
  for mode in ("shared", "unshared"):
    engine = _engine(params, config, spec, max_rows=len(prompts) * k, lengths=[plen + n] * (len(prompts) * k),
                     attention="gather", prepared=True)
    for rep in range(2):  # the first run compiles
      if mode == "shared":
        seqs = [s for p in prompts for s in engine.submit(Request(p, max_new_tokens=n, hold=True), n=k)]
      else:
        seqs = [engine.submit(Request(p, max_new_tokens=n, hold=True)) for p in prompts for _ in range(k)]
      before = dict(engine.stats)
      t = time.perf_counter()
      engine._admit()
      while engine._prefill():
        pass
      jax.block_until_ready(engine.pool)
      prefill_s = time.perf_counter() - t
      engine.run()
      prompt_pages = len({table[i] for s in seqs for table in [engine.pages.tables[s.id]]
                          for i in range(pages_for(plen - 1, engine.page_size))})
      row = {"mode": mode, "prefill_tokens": engine.stats["prefill_tokens"] - before["prefill_tokens"],
             "prompt_pages": prompt_pages, "prefill_s": prefill_s,
             "copied_pages": engine.stats["copied_pages"] - before["copied_pages"]}
      for s in seqs:
        engine.release(s)
    out["rows"].append(row)
    del engine
    gpu.print_result(out)
  return out


WORKERS = {"a": worker_a, "b": worker_b, "c": worker_c, "tp": worker_tp, "baseline": worker_baseline}


# ----------------------------------------------------------------------------- main

def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--only", default="a,b,c", help="cases to run, comma-separated (a, b, c, tp)")
  ap.add_argument("--tp", type=int, default=None, help="devices of the model axis (case tp; default 4, --tiny 2)")
  ap.add_argument("--tp-quant", default="nf4", choices=("nf4", "none"), help="linears of case tp: NF4 or bf16")
  ap.add_argument("--tp-nf4-kernel", default="auto", help="case tp, NF4: FINEFLAX_NF4_KERNEL modes to time, "
                  "comma-separated (auto, pallas: the fused kernel on each device's shard; xla; kmajor: the "
                  "K-major layout's shards and kernel, FINEFLAX_NF4_LAYOUT=kmajor)")
  ap.add_argument("--out", default="benchmarks/out/engine", help="folder for one Markdown table per case")
  ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a check of the script)")
  ap.add_argument("--baseline-path", default=None, help="folder holding the old fineflax/ (case b baseline)")
  ap.add_argument("--attention", default="gather,pallas", help="paged attention kernels to time (a, b)")
  ap.add_argument("--page-size", type=int, default=16)
  ap.add_argument("--chunk-size", type=int, default=32, help="decode steps per device call")
  ap.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma of case b's lengths")
  ap.add_argument("--admission", default=None, help="case b: admissions (reserve | watermark), comma-separated, "
                  "paired with --pool-pages (default reserve,watermark)")
  ap.add_argument("--pool-pages", default=None, help="case b: pool pages of each --admission, comma-separated; 0 = "
                  "every row's whole reserve (default 0,6144; --tiny 0,16)")
  ap.add_argument("--baseline-runs", type=int, default=2,
                  help="old sampler calls: 2 = time the second; 1 = one call minus JAX's logged compile times")
  ap.add_argument("--copy-gib", type=float, default=2.0)
  ap.add_argument("--timeout", type=float, default=560.0, help="seconds per case subprocess")
  ap.add_argument("--write-results", action="store_true", help="also write each table's RESULTS.md section")
  ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  ap.add_argument("--spec", default=None, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.worker:
    gpu.print_result(WORKERS[args.worker](json.loads(args.spec)))
    return 0
  cases = [c.strip() for c in args.only.split(",") if c.strip()]
  bad = [c for c in cases if c not in FULL]
  if bad:
    ap.error(f"--only {args.only}: unknown case(s) {bad}; choose from a, b, c, tp")
  attentions = [a.strip() for a in args.attention.split(",") if a.strip()]
  nf4_kernels = [m.strip() for m in args.tp_nf4_kernel.split(",") if m.strip()]
  if not nf4_kernels or set(nf4_kernels) - {"auto", "pallas", "xla", "kmajor"}:
    ap.error(f"--tp-nf4-kernel {args.tp_nf4_kernel!r}: modes of auto, pallas, xla, kmajor, comma-separated")
  b_runs = {}  # case b's (admission, pool pages) pairs, when given
  if args.admission or args.pool_pages:
    admissions = (args.admission or "reserve,watermark").split(",")
    pools = [int(p) for p in (args.pool_pages or "0,6144").split(",")]
    if len(admissions) != len(pools) or not set(admissions) <= {"reserve", "watermark"} or min(pools) < 0:
      ap.error(f"--admission {','.join(admissions)} --pool-pages {','.join(map(str, pools))}: as many admissions "
               "(reserve | watermark) as pool sizes (>= 0)")
    b_runs = dict(admissions=admissions, pool_pages=pools)
  out_dir = pathlib.Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  env = gpu.jax_env(**({"JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={TINY_DEVICES}"}
                       if args.tiny else {}))
  print(f"device: {gpu.device_name()}", flush=True)
  for case in cases:
    spec = dict((TINY if args.tiny else FULL)[case], **(b_runs if case == "b" else {}), page_size=args.page_size,
                chunk_size=args.chunk_size,
                sigma=args.sigma, attentions=attentions, baseline_runs=args.baseline_runs,
                tp=args.tp or (2 if args.tiny else 4), quant=args.tp_quant,
                copy_bytes=int((1 / 64 if args.tiny else args.copy_gib) * gpu.GIB))
    run = lambda name, s, **more_env: gpu.run_worker(
        [*gpu.worker_argv(__spec__.name), "--worker", name, "--spec", json.dumps(s)], env=dict(env, **more_env),
        timeout=args.timeout)
    t = time.perf_counter()
    if case == "tp" and args.tp_quant == "nf4":  # a worker per FINEFLAX_NF4_KERNEL (read while tracing)
      res = run_nf4_kernels(run, spec, nf4_kernels, attentions)
    else:
      res = run(case, spec)
    base = None
    if case == "b" and args.baseline_path:
      base = run("baseline", dict(spec, baseline_path=args.baseline_path))
    if "error" in res and not res.get("rows"):
      md = f"error: {res['error']}"
    else:
      md = {"a": table_a, "c": table_c, "tp": table_tp}[case](res) if case != "b" else table_b(res, base)
    md = f"### {TITLES[case]}\n\n{md}\n"
    name = f"engine_{case}" + (f"_{attentions[0]}" if len(attentions) == 1 and case != "c" else "")
    name += f"_{args.tp_quant}" if case == "tp" else ""
    atomic_write_text(out_dir / f"{name}.md", md)
    atomic_write_json(out_dir / f"{name}.json", {"result": res, "baseline": base}, indent=1)
    print(md, f"({time.perf_counter() - t:.0f} s)", flush=True)
    if args.write_results and not args.tiny:  # one section per table: separate calls do not overwrite
      command = "python -m benchmarks.engine " + " ".join(sys.argv[1:] if argv is None else argv)
      write_section(name, f"## Generation engine: {name} (benchmarks/engine.py)\n\nCommand: `{command}`.\n\n{md}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
