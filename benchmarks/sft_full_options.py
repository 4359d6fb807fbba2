"""Full-parameter SFT at the Llama-3.2-1B shape (issue 46 items 1 and 2): fineflax with its old defaults and with
the new options (train.moment_dtype=bfloat16, train.loss_head=fused, model.remat named policies) against
transformers eager and torch.compile, in one table of tokens/s, MFU and peak GiB.

  python -m benchmarks.sft_full_options                  # one H200, about 5 min (--budget 285 s of cases)
  python -m benchmarks.sft_full_options --smoke          # CPU: tiny shape, 1 + 1 steps, torch eager only

Each case is a fresh process of `benchmarks.sft`'s workers (the same step, batch, random bf16 weights, AdamW
with clip 1; fineflax donates the full state as the job does; torch's AdamW keeps bf16 moments for its bf16
parameters), run in the order of CASES until --budget seconds are spent (a case not started is a row saying
so; a failing case is a row with its error). tokens/s = batch x seq x steps / time of the timed steps; MFU =
`benchmarks.sft.full_step_flops` / step time / the GPU's dense bf16 peak; peak GiB = JAX `peak_bytes_in_use`
/ `torch.cuda.max_memory_allocated` (after warm-up). Ratios: tokens/s over eager and over torch.compile, and
peak over torch.compile's peak (its moments are bf16: compare with the bf16-moment rows). Writes
OUT/sft_full_options.json and .md after every case (OUT: --out, default $OUT or benchmarks/out).
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
from fineflax.models.flops import mfu, peak_bf16_flops

# name: worker settings (fineflax: remat, loss head, moment dtype; torch: gradient checkpointing, compile)
CASES = {
    "transformers eager": dict(framework="torch", ckpt=False, compile=False),
    "transformers + torch.compile": dict(framework="torch", ckpt=False, compile=True),
    "fineflax old: remat none, chunked head, f32 moments": dict(framework="fineflax", remat="none",
                                                                loss_head="chunked", moment_dtype="float32"),
    "fineflax: remat none, fused head, bf16 moments": dict(framework="fineflax", remat="none", loss_head="fused",
                                                          moment_dtype="bfloat16"),
    "fineflax: remat none, fused head, f32 moments": dict(framework="fineflax", remat="none", loss_head="fused",
                                                         moment_dtype="float32"),
    "fineflax: remat matmuls, fused head, bf16 moments": dict(framework="fineflax", remat="matmuls",
                                                             loss_head="fused", moment_dtype="bfloat16"),
    "fineflax: remat attn, fused head, bf16 moments": dict(framework="fineflax", remat="attn", loss_head="fused",
                                                          moment_dtype="bfloat16"),
}
EAGER, COMPILED = "transformers eager", "transformers + torch.compile"


def specs(smoke: bool, steps: int, warmup: int) -> dict[str, dict]:
  model = "tiny" if smoke else "Llama-3.2-1B"
  shape, batch = (sft.SMOKE_SHAPES if smoke else sft.SHAPES)[model]
  base = dict(model=model, shape=shape, batch=batch, seq=64 if smoke else 1024, steps=steps, warmup=warmup,
              params="full", logits_chunk=16 if smoke else sft.DEFAULT_CHUNK, causal_prefix=True, layer_loop="auto")
  cases = {k: v for k, v in CASES.items() if not smoke or k in (EAGER, "fineflax: remat none, fused head, bf16 moments")}
  return {name: dict(base, **case) for name, case in cases.items()}


def report(rows: dict[str, dict], device: str, command: str) -> str:
  peak = peak_bf16_flops(device)
  ok = {k: r for k, r in rows.items() if "tokens_s" in r}
  eager, compiled = ok.get(EAGER), ok.get(COMPILED)
  header = ["case", "tokens/s", "step ms", "MFU", "peak GiB", "x eager", "x torch.compile", "peak / torch.compile's"]
  table = []
  for name, r in rows.items():
    if "tokens_s" not in r:
      table.append([name, r.get("error", "?")[:100].replace("|", "/"), "", "", "", "", "", ""])
      continue
    u = mfu(sft.step_flops(r), r["seconds"] / r["steps"], peak)
    x = lambda ref: "n/a" if ref is None else f"{r['tokens_s'] / ref['tokens_s']:.2f}x"
    mem = "n/a" if not (compiled and compiled.get("peak_bytes") and r.get("peak_bytes")) else \
        f"{r['peak_bytes'] / compiled['peak_bytes']:.2f}x"
    table.append([name, round(r["tokens_s"]), round(1000 * r["seconds"] / r["steps"], 1),
                  "n/a" if u is None else f"{100 * u:.1f}%", sft.gib(r.get("peak_bytes")), x(eager), x(compiled), mem])
  any_row = next(iter(rows.values()))
  return "\n".join([
      "## Full-parameter SFT options vs transformers", "", f"Device: {device}. Command: `{command}`.", "",
      f"{any_row['model']} shape, batch {any_row['batch']} x {any_row['seq']} tokens, random weights, loss on every "
      f"token, {any_row['warmup']} warm-up + {any_row['steps']} timed steps, each case a fresh process. Targets "
      "(issue 46): >= 1.5x eager, >= 1.1x torch.compile, peak <= 1.3x torch.compile's at matching moment dtype, "
      "MFU >= 55%.", "", markdown_table(header, table), "",
      sft.FLOPS_NOTE_FULL.format(peak="unknown device: n/a" if peak is None else f"{peak / 1e12:.0f} TFLOP/s"), ""])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--smoke", action="store_true", help="tiny shape on any device")
  p.add_argument("--cases", nargs="*", default=None, help=f"subset of {list(CASES)}")
  p.add_argument("--steps", type=int, default=None, help="timed steps (default 8; smoke 1)")
  p.add_argument("--warmup", type=int, default=None, help="untimed steps, the first compiles (default 2; smoke 1)")
  p.add_argument("--budget", type=float, default=285.0, help="seconds of cases; later cases are not started")
  p.add_argument("--out", default=os.environ.get("OUT", str(pathlib.Path(__file__).with_name("out"))))
  args = p.parse_args(argv)
  steps, warmup = args.steps or (1 if args.smoke else 8), args.warmup or (1 if args.smoke else 2)
  cases = {k: v for k, v in specs(args.smoke, steps, warmup).items() if not args.cases or k in args.cases}
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  command = "python -m benchmarks.sft_full_options " + " ".join(argv if argv is not None else sys.argv[1:])
  device, rows, t_all = gpu.device_name(), {}, time.perf_counter()
  for name, spec in cases.items():
    left = args.budget - (time.perf_counter() - t_all)
    if left < 20:
      rows[name] = dict(spec, error=f"not run: {left:.0f} s of the {args.budget:.0f} s budget left")
    else:
      env = gpu.jax_env() if spec["framework"] == "fineflax" else dict(os.environ)
      worker = [*gpu.worker_argv("benchmarks.sft"), "--worker", json.dumps(spec)]
      res = gpu.run_worker(worker, env=env, timeout=left)
      rows[name] = dict(spec, **res)
      if "seconds" in res:
        rows[name]["tokens_s"] = spec["batch"] * spec["seq"] * spec["steps"] / res["seconds"]
    r = rows[name]
    print(f"[sft_full_options] {name}: " + (f"{r['tokens_s']:.0f} tokens/s, peak {sft.gib(r.get('peak_bytes'))} GiB"
                                             if "tokens_s" in r else r.get("error", "?")[:200]),
          file=sys.stderr, flush=True)
    atomic_write_json(out / "sft_full_options.json", {"device": device, "command": command.strip(), "rows": rows})
    atomic_write_text(out / "sft_full_options.md", report(rows, device, command.strip()))
  print(report(rows, device, command.strip()))
  return 0 if all("tokens_s" in r for r in rows.values()) else 1


if __name__ == "__main__":
  sys.exit(main())
