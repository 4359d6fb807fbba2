"""Decode-step part of benchmarks/nf4_gemv.py: ms a step through `SamplerSession`, NF4 vs bf16 linears.

One worker process per (model, weights): random weights of the 1B / 8B shape (benchmarks/_random_weights.py),
greedy decode of `new_tokens` after a 32-token prompt, for each batch: step ms = decode(new) wall time / new,
median of 3 runs after a compiling one. Weights: "bf16" (dense linears), "nf4-xla"
(FINEFLAX_NF4_KERNEL=xla), "nf4-auto" (=auto, FINEFLAX_NF4_TABLE = the table the products part wrote),
"nf4-pallas" (=pallas: the kernel's default config everywhere; only with --variants naming it); each with the
bnb layout (FINEFLAX_NF4_LAYOUT=bnb), except "nf4-kmajor" (=auto with the K-major copy, `NF4KMajor`).
Same tokens: the fraction of greedy tokens equal to nf4-xla's (same weights, same prompts).
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from benchmarks import gpu
from benchmarks._results import markdown_table

MODELS = {"1B": "Llama-3.2-1B", "8B": "Llama-3.1-8B"}
WEIGHTS = {"bf16": ("none", "xla", "bnb"), "nf4-xla": ("nf4", "xla", "bnb"), "nf4-auto": ("nf4", "auto", "bnb"),
           "nf4-pallas": ("nf4", "pallas", "bnb"), "nf4-kmajor": ("nf4", "auto", "kmajor")}


def decode_weights(text: str) -> list[str]:
  """The `--weights` list: comma-separated names of WEIGHTS; ValueError naming an unknown one."""
  names = [w for w in text.split(",") if w]
  unknown = [w for w in names if w not in WEIGHTS]
  if unknown or not names:
    raise ValueError(f"--weights={text!r}: {unknown or 'empty'}; expected names of {sorted(WEIGHTS)}")
  return names


def decode_worker(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from benchmarks._random_weights import random_params
  from benchmarks._engine_common import SHAPES, _config
  from fineflax.sampling import SamplerSession

  shape = dict(SHAPES["tiny"], num_layers=2) if spec["smoke"] else SHAPES[MODELS[spec["model"]]]
  config = _config(shape)
  params = random_params(config, spec["quant"], jax.random.key(0), jnp.bfloat16)
  n = spec["new_tokens"]
  out = {"device": gpu.jax_device_name(), "batches": {}}
  for b in spec["batches"]:
    try:
      prompts = np.random.default_rng(b).integers(0, config.vocab_size, (b, 32)).tolist()
      times, tokens = [], None
      for i in range(4):  # the first run compiles
        s = SamplerSession(params, config, max_total_len=32 + n, temperature=0.0, eos_ids=(), dtype=jnp.bfloat16,
                           impl="unrolled")
        s.start(prompts)
        jax.block_until_ready(s.cache)
        t = time.perf_counter()
        s.decode(n)
        jax.block_until_ready(s.cache)
        if i:
          times.append(time.perf_counter() - t)
        tokens = np.asarray(s.result(width=n).tokens).tolist()
      out["batches"][str(b)] = {"step_ms": 1e3 * statistics.median(times) / n, "tokens": tokens}
    except Exception as e:  # one batch that fails keeps the others
      out["batches"][str(b)] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print(spec["model"], spec["weights"], b, {k: v for k, v in out["batches"][str(b)].items() if k != "tokens"},
          file=sys.stderr, flush=True)
  return out


def run_decode(args, env: dict, table: str, out, kmajor_table: str = "") -> str:
  """Runs the decode workers (one process each), writes nf4_decode.json / .md under `out`, returns the md."""
  import numpy as np
  wanted = [w for w in decode_weights(args.weights) if w != "nf4-auto" or table]
  wanted += [w for w in ("nf4-pallas",) if w in args.variants.split(",")]
  batches = [1] if args.smoke else [int(b) for b in args.batches.split(",")]
  results, rows = {}, []
  for model in args.models.split(","):
    for weights in wanted:
      quant, mode, layout = WEIGHTS[weights]
      spec = {"part": "decode", "smoke": args.smoke, "model": model, "quant": quant, "weights": weights,
              "batches": batches, "new_tokens": 8 if args.smoke else 64}
      tables = {"FINEFLAX_NF4_TABLE": table, "FINEFLAX_NF4_KMAJOR_TABLE": kmajor_table}
      wenv = dict(env, FINEFLAX_NF4_KERNEL=mode, FINEFLAX_NF4_LAYOUT=layout, **{k: v for k, v in tables.items() if v})
      results[(model, weights)] = gpu.run_worker([*gpu.worker_argv("benchmarks.nf4_gemv"), "--worker",
                                                  json.dumps(spec)], env=wenv, timeout=900)
      (out / "nf4_decode.json").write_text(json.dumps({f"{m} {w}": r for (m, w), r in results.items()}))
    for b in batches:
      get = lambda w: results.get((model, w), {}).get("batches", {}).get(str(b), {})
      base, xla = get("bf16").get("step_ms"), get("nf4-xla").get("tokens")
      for w in wanted:
        r = results[(model, w)]
        r = r if "error" in r else r.get("batches", {}).get(str(b), {})
        if "error" in r:
          rows.append([model, b, w, "error: " + r["error"][:90], "", ""])
          continue
        same = "-" if w == "bf16" or xla is None else f"{np.mean(np.array(r['tokens']) == np.array(xla)):.3f}"
        rows.append([model, b, w, f"{r['step_ms']:.3f}", "-" if base is None else f"{r['step_ms'] / base:.2f}", same])
  device = next((r["device"] for r in results.values() if "device" in r), "?")
  md = "\n".join([f"## NF4 decode step vs bf16 linears (benchmarks/nf4_gemv.py --only decode), {device}", "",
                  f"Table for nf4-auto: `{table or '-'}`.", "",
                  markdown_table(["model", "batch", "weights", "step ms", "this / bf16", "same tokens as nf4-xla"],
                                 rows)])
  (out / "nf4_decode.md").write_text(md)
  return md
