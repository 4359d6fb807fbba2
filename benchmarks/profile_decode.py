"""Where a decode step's time goes: kernels per step, device-busy time vs wall time, top ops.

  python -m benchmarks.profile_decode --out DIR            # GPU: SmolLM2-135M shape, batch 1 and 64
  python -m benchmarks.profile_decode --smoke --out DIR    # CPU check: tiny shape

Per batch: a `SamplerSession` (unrolled decoder, greedy, bf16, random weights, 32-token prompts) decodes N = 64
tokens once untimed (compile), once timed (wall ms/step = decode wall time / N), once under
`jax.profiler.trace`. From the trace (as `benchmarks/profile_step.py` reads it): device kernels per step,
device-busy ms per step (sum of kernel durations / N), mean kernel duration, and the ops by time.
busy << wall means the step is bound by launching kernels, not by running them. Command buffers (CUDA
graphs) are turned off so that each kernel keeps its HLO op; the wall time with them on (XLA's default) is
measured first in a separate process and reported beside it.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time


from benchmarks import gpu
from benchmarks.profile_step import categorize, device_events
from benchmarks.sampler import SHAPES, _prompts

SMOKE_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=3, num_heads=4,
                   num_kv_heads=2, head_dim=16, tie_word_embeddings=True)
NO_GRAPHS = " --xla_gpu_enable_command_buffer="


def measure(shape: dict, batch: int, n: int, prompt_len: int, profile: bool) -> dict:
  import jax
  import jax.numpy as jnp

  from fineflax.models import ModelConfig, init_params
  from fineflax.sampling import SamplerSession

  config = ModelConfig(**shape)
  params = jax.jit(lambda k: init_params(config, k, dtype=jnp.bfloat16))(jax.random.key(0))

  def run():
    s = SamplerSession(params, config, max_total_len=n, temperature=0.0, eos_ids=(), dtype=jnp.bfloat16,
                       impl="unrolled")
    s.start(_prompts(batch, prompt_len, config.vocab_size))
    jax.block_until_ready(s.cache)
    t0 = time.perf_counter()
    s.decode(n)
    return time.perf_counter() - t0

  run()
  wall = min(run() for _ in range(3))
  out = {"batch": batch, "wall_ms": 1e3 * wall / n}
  if not profile:
    return out
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      run()
    events = device_events(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[0])
  by_op = collections.defaultdict(lambda: [0.0, 0])
  cats = collections.Counter()
  for op, kernel, ns in events:
    by_op[(op, kernel[:50])][0] += ns
    by_op[(op, kernel[:50])][1] += 1
    cats[categorize(op, kernel, {})] += ns
  busy = sum(ns for _, _, ns in events)
  top = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:12]
  out.update(kernels_per_step=len(events) / n, busy_ms=busy / 1e6 / n,
             mean_kernel_us=busy / 1e3 / max(len(events), 1),
             by_category_ms={c: ns / 1e6 / n for c, ns in cats.items()},
             top=[{"op": op, "kernel": k, "ms_per_step": ns / 1e6 / n, "per_step": cnt / n}
                  for (op, k), (ns, cnt) in top])
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="SmolLM2-135M", choices=sorted(SHAPES))
  ap.add_argument("--batches", default="1,64")
  ap.add_argument("--new-tokens", type=int, default=64)
  ap.add_argument("--smoke", action="store_true")
  ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  shape = SMOKE_SHAPE if args.smoke else SHAPES[args.model]
  if args.worker:
    spec = json.loads(args.worker)
    print(json.dumps(measure(shape, spec["batch"], args.new_tokens, 32, spec["profile"])))
    return 0
  rows = []
  for batch in [int(b) for b in args.batches.split(",")]:
    row = {}
    for graphs in (True, False):  # XLA's default first, then without command buffers (profiled)
      env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
      if not graphs:
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + NO_GRAPHS
      spec = json.dumps({"batch": batch, "profile": not graphs})
      proc = subprocess.run([*gpu.worker_argv(__spec__.name), "--worker", spec, "--new-tokens", str(args.new_tokens)]
                            + (["--smoke"] if args.smoke else ["--model", args.model]),
                            env=env, cwd=gpu.REPO, capture_output=True, text=True, timeout=600)
      if proc.returncode:
        raise SystemExit(f"profile_decode worker failed:\n{proc.stderr[-2000:]}")
      r = json.loads(proc.stdout.strip().splitlines()[-1])
      row.update(r if not graphs else {"wall_graphs_ms": r["wall_ms"]})
    rows.append(row)
    print(f"batch {batch}: wall {row['wall_graphs_ms']:.3f} ms/step (command buffers on), "
          f"{row['wall_ms']:.3f} (off); device busy {row['busy_ms']:.3f} ms in {row['kernels_per_step']:.0f} "
          f"kernels (mean {row['mean_kernel_us']:.1f} us); by category "
          + ", ".join(f"{c} {ms:.3f}" for c, ms in sorted(row["by_category_ms"].items(), key=lambda kv: -kv[1])),
          flush=True)
    for t in row["top"]:
      print(f"   {t['ms_per_step']:.4f} ms/step  {t['per_step']:.1f}x  {t['op'][:60]}  {t['kernel']}", flush=True)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  from fineflax.io import atomic_write_text
  atomic_write_text(out / f"profile_decode_{'tiny' if args.smoke else args.model}.json", json.dumps(rows, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
