"""Where the time of one LoRA SFT step goes: a device profile, per HLO op and per category.

  python -m benchmarks.profile_step --out DIR               # GPU: Llama-3.2-1B shape, 4 x 1024, bf16 LoRA
  python -m benchmarks.profile_step --quant nf4 --out DIR   # the same step on NF4 (QLoRA) weights
  python -m benchmarks.profile_step --smoke --out DIR       # CPU check: tiny shape
  python -m benchmarks.profile_step --layer-loop unrolled --out DIR   # layers as a Python loop (model.layer_loop)

Builds the step exactly as `benchmarks/sft.py` does (`make_sft_fns`, LoRA r=16 on all linears, AdamW + clip,
one right-padded sequence a row), times `--steps` steps without the profiler (tokens/s, MFU as in
`fineflax.models.flops`), then runs `--steps` more under `jax.profiler.trace` and reads the trace back with
`jax.profiler.ProfileData`. Every device kernel carries the HLO op that launched it (`hlo_op` stat); the op is
looked up in the compiled HLO text and put in one category, first match wins:

  optimizer   metadata op_name under the `optimizer` named scope (`fineflax.train.sft_step`)
  attention   cuDNN fused attention custom calls, or kernels named *fmha* / *flash*
  matmul      cuBLAS / cuBLASLt custom calls, Triton or cuDNN GEMM fusions, dot ops, *gemm* / *xmma* kernels
  dequant     other ops reading a u8 operand (NF4 codes): dequantisation that did not fuse into a matmul
  copies      copy / transpose / dynamic-(update-)slice / concatenate / memcpy / memset
  elementwise everything else (loop, input and reduction fusions)

Writes DIR/profile_<case>.md (printed too) and DIR/profile_<case>.json: per-step device time by category and
by named scope (`loss_head` = chunked logits + loss, `optimizer`), the top ops, and for NF4 the count of
matmul fusions that read u8 codes directly (dequantisation fused into the GEMM operand) vs separate
dequantisation kernels.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import pathlib
import re
import sys
import tempfile
import time


CATEGORIES = ("matmul", "attention", "elementwise", "copies", "optimizer", "dequant")
SCOPES = ("loss_head", "optimizer")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s([a-z][a-z0-9\-]*)\(")
_COPY_OPS = {"copy", "copy-start", "copy-done", "transpose", "dynamic-slice", "dynamic-update-slice",
             "concatenate", "slice", "pad", "bitcast-convert"}


def parse_hlo(text: str) -> dict[str, dict]:
  """{instruction name: {"opcode", "line"}} for every instruction of an HLO module's text."""
  out = {}
  for line in text.splitlines():
    m = _INSTR.match(line)
    if not m or line.lstrip().startswith(("HloModule", "ENTRY", "//")):
      continue
    rest = m.group(2)
    shape_end = _shape_end(rest)
    op = _OPCODE.search(" " + rest[shape_end:])
    out[m.group(1)] = {"opcode": op.group(1) if op else "?", "shape": rest[:shape_end], "line": line.strip()}
  return out


def _shape_end(rest: str) -> int:
  """Index just after the result shape at the start of `rest` (tuple shapes are parenthesised)."""
  if not rest.startswith("("):
    return rest.find(" ") if " " in rest else len(rest)
  depth = 0
  for i, ch in enumerate(rest):
    depth += ch == "("
    depth -= ch == ")"
    if depth == 0:
      return i + 1
  return len(rest)


def categorize(op_name: str, kernel: str, hlo: dict[str, dict]) -> str:
  """One of CATEGORIES for a kernel launched by HLO op `op_name` (rules in the module docstring)."""
  info = hlo.get(op_name, {})
  line, opcode, k = info.get("line", ""), info.get("opcode", ""), kernel.lower()
  if "optimizer" in _op_name_meta(line):
    return "optimizer"
  if "fmha" in line or "fmha" in k or "flash" in k:
    return "attention"
  if ("__cublas" in line or "triton_gemm" in line or "__cudnn$fusion" in line or opcode in ("dot", "convolution")
      or op_name.startswith("ynn_fusion")  # XLA:CPU's dot fusions (smoke runs)
      or any(s in k for s in ("gemm", "xmma", "cutlass", "nvjet", "ampere_", "sm90_", "sm80_"))):
    return "matmul"
  if reads_u8(op_name, hlo):
    return "dequant"
  if opcode in _COPY_OPS or "memcpy" in k or "memset" in k or _fusion_root_is_copy(line):
    return "copies"
  return "elementwise"


def reads_u8(op_name: str, hlo: dict[str, dict]) -> bool:
  """Whether the instruction has a u8 operand (NF4 codes / 8-bit absmax)."""
  line = hlo.get(op_name, {}).get("line", "")
  if hlo.get(op_name, {}).get("opcode") == "parameter":
    return False
  args = line.split("=", 1)[-1].split("metadata=")[0]
  return any(hlo.get(o, {}).get("shape", "").startswith("u8[") for o in re.findall(r"%([\w.\-]+)", args))


def _op_name_meta(line: str) -> str:
  m = re.search(r'op_name="([^"]*)"', line)
  return m.group(1) if m else ""


def _fusion_root_is_copy(line: str) -> bool:
  """Fusions XLA names after a data-movement root (loop_dynamic_update_slice_fusion, transpose_fusion...)."""
  name = line.split("=", 1)[0]
  return "fusion" in name and any(n in name.replace("-", "_") for n in
                                  ("copy", "transpose", "dynamic_update_slice", "concatenate", "dynamic_slice"))


def scope_of(op_name: str, hlo: dict[str, dict]) -> str:
  meta = _op_name_meta(hlo.get(op_name, {}).get("line", ""))
  return next((s for s in SCOPES if s in meta), "layers / other")


def device_events(xplane_path: str) -> list[tuple[str, str, float]]:
  """(hlo_op, kernel name, duration ns) of every device kernel in a trace (CPU thunks when no GPU plane)."""
  import jax
  data = jax.profiler.ProfileData.from_file(xplane_path)
  gpu = [p for p in data.planes if p.name.startswith("/device:GPU")]
  planes = gpu or [p for p in data.planes if p.name.startswith("/host:CPU")]
  events = []
  for plane in planes:
    lines = list(plane.lines)
    streams = [ln for ln in lines if ln.name.startswith("Stream")] if gpu else lines
    for line in streams or lines:
      if line.name in ("XLA Modules", "XLA Ops", "Steps", "XLA TraceMe"):
        continue
      for ev in line.events:
        stats = dict(ev.stats)
        op = stats.get("hlo_op")
        if op is None:
          if not gpu:
            continue
          op = ev.name  # memcpy / memset on a stream
        events.append((str(op), ev.name, float(ev.duration_ns)))
  return events


def summarize(events, hlo, steps: int, step_ms: float, top: int = 25) -> dict:
  """Per-step ms by category, by scope and for the `top` ops."""
  by_op = collections.defaultdict(lambda: [0.0, 0, ""])
  for op, kernel, ns in events:
    rec = by_op[op]
    rec[0] += ns
    rec[1] += 1
    rec[2] = rec[2] or kernel
  cats, scopes = collections.Counter(), collections.Counter()
  ops = []
  for op, (ns, n, kernel) in by_op.items():
    if hlo.get(op, {}).get("opcode") in ("while", "call", "conditional"):
      continue  # host-side spans around their children's kernels (CPU traces)
    cat, scope = categorize(op, kernel, hlo), scope_of(op, hlo)
    ms = ns / 1e6 / steps
    cats[cat] += ms
    scopes[scope] += ms
    ops.append({"op": op, "category": cat, "scope": scope, "ms_per_step": ms, "launches_per_step": n / steps,
                "kernel": kernel[:60], "reads_u8": reads_u8(op, hlo), "hlo": hlo.get(op, {}).get("line", "")[:160]})
  ops.sort(key=lambda r: -r["ms_per_step"])
  busy = sum(cats.values())
  return {"step_ms": step_ms, "device_busy_ms": busy, "idle_ms": max(0.0, step_ms - busy),
          "by_category": {c: cats.get(c, 0.0) for c in CATEGORIES}, "by_scope": dict(scopes),
          "top_ops": ops[:top],
          "dequant_fused_gemms": sum(1 for r in ops if r["category"] == "matmul" and r["reads_u8"]),
          "dequant_kernels": sum(1 for r in ops if r["category"] == "dequant")}


def report(s: dict, case: dict) -> str:
  pct = lambda ms: f"{100 * ms / s['step_ms']:.1f}%" if s["step_ms"] else "n/a"
  lines = [f"## Profile of one LoRA SFT step: {case['name']}", "",
           f"Device: {case['device']}. Command: `{case['command']}`.",
           f"step {s['step_ms']:.2f} ms (timed without the profiler), {case['tokens_s']:.0f} tokens/s, "
           f"MFU {case['mfu']}; device busy {s['device_busy_ms']:.2f} ms a step, idle (gaps, host) "
           f"{s['idle_ms']:.2f} ms.", "",
           "| category | ms / step | share of step |", "|---|---|---|"]
  lines += [f"| {c} | {ms:.2f} | {pct(ms)} |" for c, ms in sorted(s["by_category"].items(), key=lambda x: -x[1])]
  lines += ["", "| scope | ms / step | share of step |", "|---|---|---|"]
  lines += [f"| {c} | {ms:.2f} | {pct(ms)} |" for c, ms in sorted(s["by_scope"].items(), key=lambda x: -x[1])]
  lines += ["", "| op | category | scope | ms / step | launches / step | kernel |", "|---|---|---|---|---|---|"]
  lines += [f"| {r['op']} | {r['category']} | {r['scope']} | {r['ms_per_step']:.3f} | {r['launches_per_step']:.0f} "
            f"| `{r['kernel']}` |" for r in s["top_ops"]]
  if case.get("quant") == "nf4":
    lines += ["", f"NF4: {s['dequant_fused_gemms']} GEMM ops read u8 codes directly (dequantisation fused into "
              f"the operand); {s['dequant_kernels']} separate dequantisation ops."]
  return "\n".join(lines)


def build_step(args):
  """(compiled step, state, params, batch, model config, step FLOPs) as benchmarks/sft.py builds them."""
  import types

  import jax
  import jax.numpy as jnp
  import numpy as np

  from benchmarks._sft_fineflax import _lora_params
  from benchmarks.sft import SHAPES, SMOKE_SHAPES, model_config
  from fineflax.models import init_params
  from fineflax.models.flops import lora_step_flops
  from fineflax.models.quantize import quantize_params
  from fineflax.train.optim import make_optimizer
  from fineflax.train.sft_step import make_sft_fns
  from fineflax.train.state import init_state

  shape, batch = (SMOKE_SHAPES["tiny"] if args.smoke else SHAPES[args.model])
  b, t = args.batch or batch, args.seq or (64 if args.smoke else 1024)
  mc = model_config({"shape": shape, "seq": t, "layer_loop": args.layer_loop})
  dtype = jnp.bfloat16
  params = init_params(mc, jax.random.PRNGKey(0), dtype=dtype)
  lora, scale, _ = _lora_params(params, mc, jax.random.PRNGKey(1))
  if args.quant == "nf4":
    params = quantize_params(params)
  opt_cfg = types.SimpleNamespace(learning_rate=1e-4, warmup_steps=0, num_steps=10_000, end_lr_ratio=1.0,
                                  weight_decay=0.0, b1=0.9, b2=0.999, grad_clip=1.0)
  optimizer = make_optimizer(opt_cfg)
  train, _ = make_sft_fns(optimizer, model_config=mc, lora_scale=scale, lora_dropout=0.0, remat=args.remat,
                          dtype=dtype, logits_chunk=args.logits_chunk, causal_prefix=True)
  state = init_state(lora, optimizer, seed=0)
  tokens = np.random.default_rng(0).integers(0, mc.vocab_size, size=(1, b, t + 1), dtype=np.int32)
  data = jax.device_put({"tokens": tokens[..., :-1], "targets": tokens[..., 1:],
                         "loss_mask": np.ones((1, b, t), np.float32), "attention_mask": np.ones((1, b, t), np.int32),
                         "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (1, b, t)).copy()})
  compiled = train.lower(state, params, data).compile()
  return compiled, state, params, data, b, t, lora_step_flops(mc, b, t, 16)["total"]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="Llama-3.2-1B", help="a shape of benchmarks/sft.py")
  p.add_argument("--quant", default="none", choices=("none", "nf4"))
  p.add_argument("--remat", default="none", choices=("none", "dots", "full"))
  p.add_argument("--layer-loop", default="scan", choices=("scan", "unrolled"),
                 help="model.layer_loop: lax.scan over the stacked layers or a Python loop over them")
  p.add_argument("--logits-chunk", type=int, default=256)
  p.add_argument("--batch", type=int, default=None)
  p.add_argument("--seq", type=int, default=None)
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--top", type=int, default=25)
  p.add_argument("--smoke", action="store_true", help="tiny shape (CPU)")
  p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
  args = p.parse_args(argv)
  # XLA:GPU wraps runs of kernels in CUDA graphs ("command buffers"); the profiler then charges a whole graph
  # to its first kernel (every op reads as a memcpy). Off here, so each kernel keeps its HLO op.
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="
  import jax

  from benchmarks import gpu
  from fineflax.models.flops import mfu, peak_bf16_flops

  compiled, state, params, data, b, t, flops = build_step(args)
  dt, _ = gpu.time_jax_steps(compiled, state, params, data, warmup=2, steps=args.steps)
  step_s = dt / args.steps
  device = gpu.jax_device_name()
  u = mfu(flops, step_s, peak_bf16_flops(device))
  hlo = parse_hlo(compiled.as_text())
  state = jax.tree.map(lambda x: x, state)
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      box = {"state": state}
      for _ in range(args.steps):
        box["state"], metrics = compiled(box["state"], params, data)
      jax.block_until_ready((box["state"], metrics))
    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
      raise SystemExit(f"profile_step: no .xplane.pb written under {trace_dir}")
    events = device_events(paths[0])
  name = ("tiny" if args.smoke else args.model) + f", {b} x {t}, {'QLoRA NF4' if args.quant == 'nf4' else 'bf16'}" \
      + f" LoRA, remat {args.remat}" + (", unrolled layers" if args.layer_loop == "unrolled" else "")
  s = summarize(events, hlo, args.steps, 1000 * step_s, args.top)
  case = {"name": name, "device": device, "quant": args.quant, "tokens_s": b * t / step_s,
          "mfu": "n/a" if u is None else f"{100 * u:.1f}%",
          "command": "python -m benchmarks.profile_step " + " ".join(argv if argv is not None else sys.argv[1:])}
  md = report(s, case)
  print(md)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  tag = f"{'tiny' if args.smoke else args.model}_{args.quant}_{args.remat}" + (
      "_unrolled" if args.layer_loop == "unrolled" else "")
  from fineflax.io import atomic_write_text
  atomic_write_text(out / f"profile_{tag}.md", md + "\n")
  atomic_write_text(out / f"profile_{tag}.json", json.dumps(dict(s, **case), indent=1))
  with gzip.open(out / f"profile_{tag}.hlo.txt.gz", "wt") as f:  # the compiled step, for op look-ups
    f.write(compiled.as_text())
  print(f"[profile] wrote {out}/profile_{tag}.md and .json ({len(events)} kernels, {time.strftime('%T')})",
        file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
