"""The fit check's estimate against the measured peak (issue 52 item 3): `fineflax.jobs.memory_plan`'s update
phase of an SFT step vs JAX's `peak_bytes_in_use` of that step, compiled and run on one GPU.

  python -m benchmarks.memory_plan_check                 # one H200, about 3-4 min: the cases below
  python -m benchmarks.memory_plan_check --smoke         # CPU: tiny shape (no peak on CPU: estimate only)

Each case runs in a fresh process (`benchmarks.sft.fineflax_worker`: random bf16 weights of the shape, the
`make_sft_fns` step as the sft job builds it, full training donating its state; JAX without preallocation, so
the peak is the program's own) and is planned with `PlanInputs` of the same settings (one device, fsdp 1,
bf16 compute, cuDNN attention, `update_rows` x `prompt_tokens` = the batch). ratio = estimate / measured peak;
the target is within 15% (0.85 to 1.15). Writes OUT/memory_plan_check.json and .md after every case
(OUT: --out, default $OUT or benchmarks/out); a failing case is a row with its error.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

from benchmarks import gpu, sft
from benchmarks._results import markdown_table
from fineflax.io import atomic_write_json, atomic_write_text

LLAMA_3B = dict(vocab=128256, hidden=3072, inter=8192, layers=28, heads=24, kv_heads=8, head_dim=128,
                rope_theta=500000.0)
LLAMA_1B = sft.SHAPES["Llama-3.2-1B"][0]
# name: (shape, batch, seq, params, remat, moment dtype[, loss head])
CASES = {
    "1B full, remat none, f32 moments": (LLAMA_1B, 4, 1024, "full", "none", "float32"),
    "1B full, remat none, bf16 moments": (LLAMA_1B, 4, 1024, "full", "none", "bfloat16"),
    "1B LoRA r=16, remat none": (LLAMA_1B, 4, 1024, "lora", "none", "float32"),
    "3B full, remat full, f32 moments": (LLAMA_3B, 4, 2048, "full", "full", "float32"),
    "1B full, remat matmuls, fused head, bf16 moments": (LLAMA_1B, 4, 1024, "full", "matmuls", "bfloat16", "fused"),
}  # the last case is run only when named in --cases (the default four take about 3.5 min on one H200)
DEFAULT_CASES = tuple(CASES)[:4]
SMOKE = {"tiny full": (sft.SMOKE_SHAPES["tiny"][0], 2, 64, "full", "none", "float32")}
CHUNK = sft.DEFAULT_CHUNK
TOLERANCE = 0.15


def spec_of(name: str, case) -> dict:
  shape, batch, seq, params, remat, moments, *head = case
  return dict(model=name, shape=shape, batch=batch, seq=seq, params=params, remat=remat, moment_dtype=moments,
              loss_head=head[0] if head else "chunked",
              logits_chunk=CHUNK, causal_prefix=True, layer_loop="auto", warmup=1, steps=2, framework="fineflax")


def estimate(spec: dict) -> dict[str, float]:
  """The plan's update phase (bytes by term) of the case: one device, its batch and settings."""
  from fineflax.jobs.memory_plan import PlanInputs, update_phase
  inputs = PlanInputs(model=sft.model_config(spec), n_devices=1, fsdp=1, compute_bytes=2, params=spec["params"],
                      master_bytes=2, moment_bytes=2 if spec["moment_dtype"] == "bfloat16" else 4, quant="none",
                      lora_rank=sft.LORA_R, remat=spec["remat"], attention="cudnn", logits_chunk=spec["logits_chunk"],
                      update_rows=spec["batch"], prompt_tokens=spec["seq"], loss_head=spec.get("loss_head", "chunked"),
                      micro_key="train.micro_batch_tokens")
  return update_phase(inputs)


def report(rows: list[dict], device: str, command: str) -> str:
  header = ["case", "batch x seq", "estimate GiB", "measured peak GiB", "estimate / peak", "within 15%",
            "largest terms (GiB)"]
  table = []
  for r in rows:
    est = sum(r["terms"].values())
    top = ", ".join(f"{k} {v / gpu.GIB:.1f}" for k, v in sorted(r["terms"].items(), key=lambda kv: -kv[1])[:3])
    peak = r.get("peak_bytes")
    ratio = est / peak if peak else None
    table.append([r["model"], f"{r['batch']} x {r['seq']}", f"{est / gpu.GIB:.2f}",
                  r.get("error", "")[:80] or ("n/a" if peak is None else f"{peak / gpu.GIB:.2f}"),
                  "n/a" if ratio is None else f"{ratio:.3f}",
                  "n/a" if ratio is None else ("yes" if abs(ratio - 1) <= TOLERANCE else "**no**"), top])
  return "\n".join(["## Memory plan vs measured peak (one SFT step)", "", f"Device: {device}. Command: `{command}`.",
                    "", markdown_table(header, table), ""])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--smoke", action="store_true", help="tiny shape on any device")
  p.add_argument("--cases", nargs="*", default=None, help=f"subset of {list(CASES)}")
  p.add_argument("--out", default=os.environ.get("OUT", str(pathlib.Path(__file__).with_name("out"))))
  args = p.parse_args(argv)
  cases = SMOKE if args.smoke else {k: v for k, v in CASES.items() if k in (args.cases or DEFAULT_CASES)}
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  command = "python -m benchmarks.memory_plan_check " + " ".join(argv if argv is not None else sys.argv[1:])
  device, rows = gpu.device_name(), []
  for name, case in cases.items():
    spec, t = spec_of(name, case), time.perf_counter()
    res = gpu.run_worker([*gpu.worker_argv("benchmarks.sft"), "--worker", json.dumps(spec)], env=gpu.jax_env())
    row = dict(spec, terms=estimate(spec), peak_bytes=res.get("peak_bytes"), xla_bytes=res.get("xla_bytes"),
               **({"error": res["error"]} if "error" in res else {}))
    rows.append(row)
    peak = "n/a" if not row["peak_bytes"] else f"{row['peak_bytes'] / gpu.GIB:.2f}"
    print(f"[memory_plan_check] {name}: estimate {sum(row['terms'].values()) / gpu.GIB:.2f} GiB, peak {peak} GiB "
          f"({time.perf_counter() - t:.0f}s)", file=sys.stderr, flush=True)
    atomic_write_json(out / "memory_plan_check.json", {"device": device, "command": command.strip(), "rows": rows})
    atomic_write_text(out / "memory_plan_check.md", report(rows, device, command.strip()))
  print(report(rows, device, command.strip()))
  return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
