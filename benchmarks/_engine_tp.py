"""Case tp of benchmarks/engine.py, tensor-parallel decoding: the worker (weights and pages split over a "model"
mesh axis, ms a decode step, per-device weight-read bound, peak memory per device) and, for NF4 linears, one
worker process per FINEFLAX_NF4_KERNEL mode with the rows merged.
"""
from __future__ import annotations

import os
import time

from benchmarks import gpu
from benchmarks._decode_timing import time_decode
from benchmarks._engine_common import SHAPES, _config, _prompts


def worker_tp(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  from fineflax.engine import Engine, tensor_parallel as tp
  from fineflax.engine.decode import decode_impl
  from fineflax.mesh import make_mesh
  from fineflax.sampling.session import engine_pool_pages
  config = _config(SHAPES[spec["shape"]])
  n, impl = spec["tp"], decode_impl(spec.get("impl", "auto"))
  bw = gpu.jax_copy_bandwidth(spec["copy_bytes"])
  mesh = make_mesh(data=1, model=n, devices=jax.devices()[:n])
  t = time.perf_counter()
  params = tp.random_decode_params(config, mesh, jnp.bfloat16, impl, quant=spec["quant"])
  jax.block_until_ready(params)
  init_s = time.perf_counter() - t
  per_device = tp.bytes_per_device(params)
  whole = sum(x.nbytes for x in jax.tree.leaves(params))
  rows, plen, new = spec["rows"], spec["prompt_len"], spec["new_tokens"]
  kv = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 2 // n  # bytes a token, one device
  live_kv = rows * kv * (plen + (new - 1) / 2)
  read_ms = 1e3 * max(per_device.values()) / bw
  out = {"device": gpu.jax_device_name(), "devices": n, "impl": impl, "quant": spec["quant"], "bw": bw,
         "weight_bytes": whole,
         "device_weight_bytes": max(per_device.values()), "read_ms": read_ms,
         "read_kv_ms": read_ms + 1e3 * live_kv / bw, "init_s": init_s, "rows": []}
  gpu.print_result(out)
  mode = (os.environ.get("FINEFLAX_NF4_KERNEL", "auto") + ("+kmajor" if os.environ.get("FINEFLAX_NF4_LAYOUT") ==
          "kmajor" else "")) if spec["quant"] == "nf4" else None  # one a process
  for attention in spec["attentions"]:
    try:
      engine = Engine(params, config, max_rows=rows, page_size=spec["page_size"], chunk_size=spec["chunk_size"],
                      num_pages=engine_pool_pages([plen + new] * rows, spec["page_size"]), eos_ids=(),
                      dtype=jnp.bfloat16, attention=attention, impl=impl, prepared=True, mesh=mesh)
      t = time.perf_counter()
      compiled = engine.precompile([rows], plen + new)
      compile_s = time.perf_counter() - t
      dt, steps = time_decode(engine, _prompts(rows, plen, config.vocab_size), new, new)
      peaks = [int((d.memory_stats() or {}).get("peak_bytes_in_use", 0)) for d in mesh.devices.flat]
      pool = tp.bytes_per_device(engine.pool)
      out["rows"].append({"attention": attention, "nf4_kernel": mode, "ms_step": 1e3 * dt / steps, "steps": steps,
                          "programs": compiled, "compile_s": compile_s, "peak_gib": [p / gpu.GIB for p in peaks],
                          "pool_gib_device": max(pool.values()) / gpu.GIB})
      del engine
    except Exception as e:  # noqa: BLE001 - reported in the table
      out["rows"].append({"attention": attention, "nf4_kernel": mode, "error": f"{type(e).__name__}: {str(e)[:300]}"})
    gpu.print_result(out)
  return out


def run_nf4_kernels(run, spec: dict, kernels: list[str], attentions: list[str]) -> dict:
  """Case tp with NF4 linears: `run("tp", spec, **env)` once per mode of `kernels` (FINEFLAX_NF4_KERNEL is read
  while tracing, so one process a mode; kmajor: the K-major layout), the results' rows merged."""
  res = {}
  for mode in kernels:
    layout = {"FINEFLAX_NF4_KERNEL": "auto", "FINEFLAX_NF4_LAYOUT": "kmajor"} if mode == "kmajor" else {
        "FINEFLAX_NF4_KERNEL": mode, "FINEFLAX_NF4_LAYOUT": "bnb"}
    one = run("tp", spec, **layout)
    res = {**one, **res, "rows": res.get("rows", []) + one.get("rows", [])}
    if "error" in one and not one.get("rows"):
      res["rows"].append({"attention": ",".join(attentions), "nf4_kernel": mode, "error": one["error"]})
  return res
