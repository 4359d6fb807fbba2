"""Decode throughput of `fineflax.sampling.generate` vs transformers `generate`, same GPU, same run.

  python -m benchmarks.sampler                      # GPU: SmolLM2-135M and Llama-3.2-1B shapes (< 6 min, H100)
  python -m benchmarks.sampler --gguf PATH.gguf     # SmolLM2 with its real weights (else random, same shape)
  python -m benchmarks.sampler --smoke              # CPU check: tiny shapes, prints only (RESULTS.md untouched)
  python -m benchmarks.sampler --hf-static          # adds transformers with a static cache (no torch.compile)

Each prompt is 32 random tokens; 256 new tokens, EOS ignored (fineflax eos_ids=(), transformers
min_new_tokens = max_new_tokens); greedy; bf16 weights, bf16 KV cache. tokens/s = batch * new tokens /
wall time of the whole call (prefill included) after one untimed call (the compile / warm-up).
Batch-1 step time of the 1B model vs weight-read time: step = batch-1 wall time / new tokens;
weight read = bf16 weight bytes / HBM bandwidth, bandwidth = 2 * bytes / time of a jitted `x + 1` over
a 4 GiB array (bytes read and written, as the device copy figures are quoted).
fineflax runs in one subprocess, transformers in another (JAX without preallocation).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import sys
import time


from benchmarks import gpu
from benchmarks._results import markdown_table, write_section

SHAPES = {
    "SmolLM2-135M": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                         num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True),
    "Llama-3.2-1B": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
                         num_heads=32, num_kv_heads=8, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0,
                         tie_word_embeddings=True,
                         rope_scaling=(("factor", 32.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                                       ("original_max_position_embeddings", 8192), ("rope_type", "llama3"))),
}
SMOKE_SHAPES = {"tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                             num_kv_heads=2, head_dim=16, tie_word_embeddings=True)}


def _prompts(batch: int, length: int, vocab: int, seed: int = 0):
  import numpy as np
  return np.random.default_rng(seed).integers(3, vocab, (batch, length)).tolist()


# ----------------------------------------------------------------------------- fineflax worker

def jax_worker(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  from fineflax.models import ModelConfig, init_params
  from fineflax.sampling import generate
  out = {"device": gpu.jax_device_name(), "rows": []}
  for name, shape in spec["shapes"].items():
    if shape.get("rope_scaling"):  # JSON made the tuples lists; the config must stay hashable
      shape = dict(shape, rope_scaling=tuple(tuple(kv) for kv in shape["rope_scaling"]))
    config = ModelConfig(**shape)
    if name == "SmolLM2-135M" and spec.get("gguf"):
      from fineflax.models import load
      params, config, _ = load(spec["gguf"], dtype=jnp.bfloat16, with_tokenizer=False)
    else:
      params = jax.jit(lambda k: init_params(config, k, dtype=jnp.bfloat16))(jax.random.key(0))
    n = spec["new_tokens"]
    for batch in spec["batches"]:
      prompts = _prompts(batch, spec["prompt_len"], config.vocab_size)
      run = lambda: generate(params, config, prompts, max_new_tokens=n, temperature=0.0, eos_ids=(),
                             dtype=jnp.bfloat16)
      t = time.perf_counter()
      res = run()
      compile_s = time.perf_counter() - t
      assert res.mask.all(), "a row stopped early"
      t = time.perf_counter()
      run()
      dt = time.perf_counter() - t
      out["rows"].append({"model": name, "batch": batch, "tok_s": batch * n / dt, "step_ms": 1e3 * dt / n,
                          "first_call_s": compile_s})
      print(f"fineflax {name} B={batch}: {batch * n / dt:.0f} tok/s ({1e3 * dt / n:.2f} ms/step)",
            file=sys.stderr, flush=True)
    if name == "Llama-3.2-1B" or spec.get("smoke"):
      out["weight_bytes"] = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    del params
  out["hbm_bytes_s"] = gpu.jax_copy_bandwidth(spec["copy_bytes"])
  return out


# ----------------------------------------------------------------------------- transformers worker

def torch_worker(spec: dict) -> dict:
  import torch
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  out = {"device": gpu.torch_device_name(), "rows": []}
  for name, shape in spec["shapes"].items():
    model = gpu.torch_random_llama(shape, dev)
    n = spec["new_tokens"]
    for cache in ["dynamic"] + (["static"] if spec.get("hf_static") else []):
      for batch in spec["batches"]:
        ids = torch.tensor(_prompts(batch, spec["prompt_len"], shape["vocab_size"]), device=dev)
        kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                  pad_token_id=0)
        if cache == "static":
          kw["cache_implementation"] = "static"
        sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
        with torch.no_grad():
          model.generate(ids, **dict(kw, max_new_tokens=8, min_new_tokens=8))
          sync()
          t = time.perf_counter()
          model.generate(ids, **kw)
          sync()
          dt = time.perf_counter() - t
        out["rows"].append({"model": name, "batch": batch, "cache": cache, "tok_s": batch * n / dt})
        print(f"transformers ({cache}) {name} B={batch}: {batch * n / dt:.0f} tok/s", file=sys.stderr,
              flush=True)
    del model
    if dev == "cuda":
      torch.cuda.empty_cache()
  return out


# ----------------------------------------------------------------------------- driver

def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--smoke", action="store_true", help="CPU check with tiny shapes; does not write RESULTS.md")
  ap.add_argument("--gguf", default="", help="SmolLM2-135M-Instruct .gguf (else random weights)")
  ap.add_argument("--batches", default="", help="comma-separated batch sizes (default 1,16,64,256)")
  ap.add_argument("--new-tokens", type=int, default=0)
  ap.add_argument("--hf-static", action="store_true", help="also time transformers with a static cache")
  ap.add_argument("--no-hf", action="store_true", help="skip transformers")
  ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.worker:
    spec = json.loads(args.worker)
    gpu.print_result(jax_worker(spec) if spec["side"] == "jax" else torch_worker(spec))
    return
  spec = {"shapes": SMOKE_SHAPES if args.smoke else SHAPES, "prompt_len": 8 if args.smoke else 32,
          "new_tokens": args.new_tokens or (8 if args.smoke else 256),
          "batches": [int(b) for b in args.batches.split(",")] if args.batches else
                     ([1, 2] if args.smoke else [1, 16, 64, 256]),
          "gguf": args.gguf, "smoke": args.smoke, "hf_static": args.hf_static,
          "copy_bytes": (1 << 24) if args.smoke else (1 << 32)}
  worker = lambda side, env=None: gpu.run_worker(
      [*gpu.worker_argv(__spec__.name), "--worker", json.dumps(dict(spec, side=side))], env=env, timeout=900)
  ours = worker("jax", gpu.jax_env())
  theirs = {"rows": []} if args.no_hf else worker("torch")
  for r in (ours, theirs):
    if "error" in r:
      print("worker failed:", r["error"], file=sys.stderr)
  hf = {(r["model"], r["batch"], r["cache"]): r["tok_s"] for r in theirs.get("rows", [])}
  caches = ["dynamic"] + (["static"] if args.hf_static else [])
  header = ["model", "batch", "fineflax tok/s", "ms/step"] + [f"transformers {c} tok/s" for c in caches] + \
      ["speedup vs dynamic"]
  rows = []
  for r in ours.get("rows", []):
    ref = [hf.get((r["model"], r["batch"], c)) for c in caches]
    rows.append([r["model"], r["batch"], round(r["tok_s"]), r["step_ms"]] + [round(x) if x else "-" for x in ref]
                + [r["tok_s"] / ref[0] if ref[0] else "-"])
  lines = [f"Device: {ours.get('device', gpu.device_name())} (transformers: {theirs.get('device', '-')}). "
           f"Command: `python {shlex.join(['benchmarks/sampler.py'] + (argv or sys.argv[1:]))}`.",
           f"Prompt {spec['prompt_len']} random tokens, {spec['new_tokens']} new tokens, greedy, EOS ignored, "
           f"bf16; weights {'from ' + pathlib.Path(args.gguf).name if args.gguf else 'random'} "
           "(SmolLM2), random (1B). tokens/s = batch * new tokens / wall time of one call (prefill "
           "included), after a warm-up call.", "", markdown_table(header, rows)]
  if "hbm_bytes_s" in ours and "weight_bytes" in ours:
    big = "tiny" if args.smoke else "Llama-3.2-1B"
    step = next((r["step_ms"] for r in ours["rows"] if r["model"] == big and r["batch"] == 1), None)
    read_ms = 1e3 * ours["weight_bytes"] / ours["hbm_bytes_s"]
    lines += ["", f"Batch-1 decode step of {big}: {step:.3f} ms; weight read {ours['weight_bytes'] / 1e9:.2f} GB "
              f"at {ours['hbm_bytes_s'] / 1e12:.2f} TB/s (measured `x + 1` over {spec['copy_bytes'] / 1e9:.2g} GB) "
              f"= {read_ms:.3f} ms; step / weight read = {step / read_ms:.2f}." if step else ""]
  md = "\n".join(lines)
  print(md)
  if not args.smoke:
    write_section("sampler", "## Sampler decode throughput\n\n" + md)


if __name__ == "__main__":
  main()
