"""LoRA SFT training throughput and peak GPU memory: fineflax vs transformers + peft, same GPU, same run.

  python -m benchmarks.sft                 # GPU: SmolLM2-135M and Llama-3.2-1B shapes, seq 1024 (< 5 min on H100)
  python -m benchmarks.sft --smoke         # CPU check: tiny shapes, 2 steps, prints only (RESULTS.md untouched)
  python -m benchmarks.sft --torch-compile # adds a torch.compile case per model (slow to compile)
  python -m benchmarks.sft --sweep         # adds remat=dots, logits_chunk=1024 and masked-attention cases
  python -m benchmarks.sft --layer-loop both --models Llama-3.2-1B --frameworks fineflax --section sft_unroll
                                           # each fineflax case with the layer scan and the unrolled loop
  python -m benchmarks.sft --params full --models Llama-3.2-1B --torch-compile
                                           # full-parameter SFT vs transformers full fine-tuning (section sft_full)

Both sides: random bf16 weights of the model's shape (tied embeddings), random tokens, loss on every
token, LoRA r=16 alpha=32 on q,k,v,o,gate,up,down (fp32 adapters, bf16 compute), AdamW + global-norm clip 1.
fineflax: `make_sft_fns` train step (jit) over a [A=1, B, T] batch of one sequence a row
(`causal_prefix=True`: plain causal attention, cuDNN's causal kernel on GPUs), remat none and full
(`--sweep`: also dots, logits chunk 1024, and the masked-attention path that packed batches take).
torch: `AutoModelForCausalLM.from_config` (sdpa attention) + peft `get_peft_model`, autocast bf16, fused
AdamW, gradient checkpointing off / on.
Every case runs in a fresh subprocess (separate memory peaks; JAX with XLA_PYTHON_CLIENT_PREALLOCATE=false).
tokens/s = B * T * steps / time of `steps` timed steps after `warmup` untimed ones (the first compiles).
ratio = tokens/s over the torch case with matching recomputation (remat none <-> checkpointing off,
remat dots/full <-> checkpointing on). `--layer-loop` picks `model.layer_loop` (default auto, as the configs:
unrolled on GPUs with remat none, else scan; scan: `lax.scan` over the stacked layers; unrolled: a Python
loop over per-layer slices; both: every fineflax case once each with scan and unrolled).
MFU = `fineflax.models.flops.lora_step_flops` / step time / the GPU's dense bf16 peak (`peak_bf16_flops`;
formula printed under the table), the same model FLOPs for both frameworks.

`--params full` (or `both`): full-parameter training instead of LoRA, RESULTS.md section `sft_full`
(`--section X`: X_full). fineflax: the same `make_sft_fns` step with `config.train.params="full"`'s state
(`init_state` of the whole bf16 model, base=None; `make_optimizer`'s `with_f32_state`: f32 AdamW moments,
bf16 parameters updated in place of a master copy; the state donated, as the job's step donates it;
`moment_dtype` in a case's spec: bf16 moments). torch: the `from_config` bf16 model with every
parameter trainable (no peft), the same autocast step (`gpu.time_torch_lora_steps`), AdamW fused on CUDA
(foreach on CPU): torch's AdamW keeps exp_avg / exp_avg_sq in the parameter dtype (bf16 here; it has no
option for f32 moments of bf16 parameters), so torch reads and writes half the optimizer bytes fineflax
does. Gradient checkpointing off / on against remat none / full as for LoRA; `--torch-compile` adds the
torch.compile case (checkpointing off). MFU of a full step: `full_step_flops`.

Layout: the fineflax worker (and the LoRA / AdamW recipe) in benchmarks/_sft_fineflax.py, the torch worker in
benchmarks/_sft_torch.py; the cases, the model FLOPs, the report and the CLI here.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import sys
import time


from benchmarks import gpu
from benchmarks._results import markdown_table, write_section
from benchmarks._sft_fineflax import LORA_R, fineflax_worker, model_config
from benchmarks._sft_torch import torch_worker
from fineflax.io import atomic_write_json
from fineflax.models.flops import lora_step_flops, mfu, peak_bf16_flops

SHAPES = {  # name: (model shape, batch); head_dim 64 for all
    "SmolLM2-135M": (dict(vocab=49152, hidden=576, inter=1536, layers=30, heads=9, kv_heads=3, head_dim=64,
                          rope_theta=100000.0), 8),
    "Llama-3.2-1B": (dict(vocab=128256, hidden=2048, inter=8192, layers=16, heads=32, kv_heads=8, head_dim=64,
                          rope_theta=500000.0), 4),
}
PARAMS = ("lora", "full")  # what a case trains (--params)
SMOKE_SHAPES = {"tiny": (dict(vocab=512, hidden=64, inter=128, layers=2, heads=4, kv_heads=2, head_dim=16,
                              rope_theta=10000.0), 2)}
DEFAULT_CHUNK = 256  # configs/quickstart.py: model.logits_chunk


# ----------------------------------------------------------------------------- orchestration

def full_step_flops(config, batch: int, seq: int) -> float:
  """Model FLOPs of one full-parameter step: 6 N (P_lin + H V) + 6 B T^2 Hq D L, i.e. `lora_step_flops`
  at rank 0 (4 N (P_lin + H V): forward + input gradient, + attention) plus the weight gradients of the
  linears and the output head, 2 N (P_lin + H V). The embedding lookup's gradient is a scatter-add
  (no matmul FLOPs); remat recomputation not counted."""
  f = lora_step_flops(config, batch, seq, 0)
  return 1.5 * f["base"] + f["attention"]


def step_flops(spec: dict) -> float:
  """Model FLOPs of one step of this case (`lora_step_flops`, or `full_step_flops` for --params full)."""
  if spec.get("params", "lora") == "full":
    return full_step_flops(model_config(spec), spec["batch"], spec["seq"])
  return lora_step_flops(model_config(spec), spec["batch"], spec["seq"], LORA_R)["total"]


# best fineflax / best transformers(+peft) tokens/s targets (eager, torch.compile): issue 17 for LoRA,
# issue 31 for full-parameter training of the 1B shape
SPEED_TARGETS = {"lora": {"SmolLM2-135M": (1.5, None), "Llama-3.2-1B": (1.6, 1.0)},
                 "full": {"Llama-3.2-1B": (1.5, 1.1)}}

FLOPS_NOTE = ("MFU = model FLOPs / step time / the GPU's dense bf16 peak ({peak}). Model FLOPs of a step "
              "(`fineflax.models.flops.lora_step_flops`), N = batch x seq tokens: 4 N (P_lin + H V) for the "
              "frozen linears and output head (forward + input gradient, no weight gradient) + 6 N P_lora "
              "(adapters: forward, input and weight gradients) + 6 B T^2 Hq D L (causal attention: q.k and p.v "
              "over T^2/2 pairs, backward 2x forward); remat recomputation not counted.")
FLOPS_NOTE_FULL = ("MFU = model FLOPs / step time / the GPU's dense bf16 peak ({peak}). Model FLOPs of a "
                   "full-parameter step (`benchmarks.sft.full_step_flops`), N = batch x seq tokens: 6 N (P_lin + "
                   "H V) for the linears and the output head (forward, input and weight gradients) + 6 B T^2 Hq D L "
                   "(causal attention); remat recomputation not counted.")

def cases(args) -> list[dict]:
  """One dict per (model, framework, setting); each runs in its own subprocess."""
  shapes = SMOKE_SHAPES if args.smoke else SHAPES
  seq = args.seq or (64 if args.smoke else 1024)
  out = []
  for params in PARAMS if args.params == "both" else (args.params,):
    for model, (shape, batch) in shapes.items():
      if args.models and model not in args.models:
        continue
      base = dict(model=model, shape=shape, batch=args.batch or batch, seq=seq, steps=args.steps,
                  warmup=args.warmup, params=params)
      chunk = 16 if args.smoke else DEFAULT_CHUNK
      sweep = [("none", chunk, True), ("full", 32 if args.smoke else chunk, True)]
      if args.sweep or args.smoke:
        sweep.insert(1, ("none", chunk, False))
      if args.sweep:
        sweep += [("none", min(1024, seq), True), ("dots", chunk, True)]
      loops = ("scan", "unrolled") if args.layer_loop == "both" else (args.layer_loop,)
      for remat, logits_chunk, causal in sweep:
        for loop in loops:
          out.append(dict(base, framework="fineflax", remat=remat, logits_chunk=logits_chunk,
                          causal_prefix=causal, layer_loop=loop,
                          default=(remat, logits_chunk, causal, loop) == ("none", chunk, True, "auto")))
      for ckpt in (False, True):
        out.append(dict(base, framework="torch", ckpt=ckpt, compile=False))
      if args.torch_compile:
        out.append(dict(base, framework="torch", ckpt=False, compile=True))
  return [c for c in out if not args.frameworks or c["framework"] in args.frameworks]


def setting(c: dict) -> str:
  if c["framework"] == "fineflax":
    return (f"remat={c['remat']}, logits_chunk={c['logits_chunk']}"
            + ("" if c.get("causal_prefix", True) else ", masked attention")
            + (", unrolled layers" if c.get("layer_loop", "scan") == "unrolled" else "")
            + (" (default)" if c.get("default") else ""))
  return ("sdpa, " + ("grad ckpt on" if c["ckpt"] else "grad ckpt off")
          + (", torch.compile" if c["compile"] else ""))


def torch_name(params: str) -> str:
  """The torch side's name in the report: transformers+peft for LoRA, transformers alone for full."""
  return "transformers" if params == "full" else "transformers+peft"


def recomputes(c: dict) -> bool:
  return c["remat"] != "none" if c["framework"] == "fineflax" else c["ckpt"]


def gib(x):
  return "n/a" if x is None else round(x / gpu.GIB, 2)


def report(rows: list[dict], device: str, command: str, smoke: bool) -> str:
  """The markdown section of `rows`, all of one `params` kind (lora or full)."""
  params = rows[0].get("params", "lora")
  full, ref_name = params == "full", torch_name(params)
  header = ["model", "framework", "setting", "batch x seq", "tokens/s", "step ms", "MFU", "peak GiB",
            "XLA est. GiB", "compile / 1st step s", "ratio"]
  peak = peak_bf16_flops(device)
  table, summary = [], []
  for model in dict.fromkeys(r["model"] for r in rows):
    mine = [r for r in rows if r["model"] == model]
    torch_ref = {recomputes(r): r["tokens_s"] for r in mine
                 if r["framework"] == "torch" and not r["compile"] and "tokens_s" in r}
    for r in mine:
      if "error" in r:
        table.append([model, r["framework"], setting(r), f"{r['batch']} x {r['seq']}", "error: " + r["error"][:80],
                      "", "", "", "", "", ""])
        continue
      ref = torch_ref.get(recomputes(r))
      ratio = f"{r['tokens_s'] / ref:.2f}x" if ref else "n/a"
      u = mfu(step_flops(r), r["seconds"] / r["steps"], peak)
      table.append([model, r["framework"], setting(r), f"{r['batch']} x {r['seq']}", round(r["tokens_s"]),
                    round(1000 * r["seconds"] / r["steps"], 1), "n/a" if u is None else f"{100 * u:.1f}%",
                    gib(r["peak_bytes"]), gib(r["xla_bytes"]),
                    round(r["compile_s"], 1), ratio])
    ok = [r for r in mine if "tokens_s" in r]
    if full:  # both sides must train the same parameters (tied embeddings counted once)
      counts = {r["framework"]: r.get("trainable_params") for r in ok}
      summary.append(f"- {model}: trainable parameters: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()
                                                                     if v is not None))
    kinds = {"fineflax": lambda r: r["framework"] == "fineflax",
             "eager": lambda r: r["framework"] == "torch" and not r["compile"],
             "compile": lambda r: r["framework"] == "torch" and r["compile"]}
    best = {k: max(filter(f, ok), key=lambda r: r["tokens_s"], default=None) for k, f in kinds.items()}
    ff = best["fineflax"]
    if ff:
      u = mfu(step_flops(ff), ff["seconds"] / ff["steps"], peak)
      if u is not None:
        summary.append(f"- {model}: best fineflax MFU **{100 * u:.1f}%**" + (
            f" (target >= 45%: {'met' if u >= 0.45 else 'missed'})" if model == "Llama-3.2-1B" and not full
          else ""))
    for kind, target in zip(("eager", "compile"), SPEED_TARGETS[params].get(model, (None, None))):
      ref = best[kind]
      if ff and ref:
        x = ff["tokens_s"] / ref["tokens_s"]
        summary.append(f"- {model}: best fineflax ({setting(ff)}) {ff['tokens_s']:.0f} tokens/s vs best "
                       f"{ref_name} {'eager' if kind == 'eager' else 'torch.compile'} ({setting(ref)}) "
                       f"{ref['tokens_s']:.0f}: **{x:.2f}x**"
                       + (f" (target >= {target}x: {'met' if x >= target else 'missed'})" if target else ""))
    summary += loop_ratios(ok, peak)
  versions = {}
  for r in rows:
    versions.update(r.get("versions", {}))
  title = ("## SFT training throughput (" + ("full parameters, bf16 + f32 AdamW moments" if full
                                           else "LoRA r=16, all linears, bf16") + ")"
           + (" — SMOKE (tiny shapes, CPU)" if smoke else ""))
  what = ("every parameter trained (bf16 parameters; AdamW moments f32 in fineflax, bf16 in torch: its AdamW keeps "
          "them in the parameter dtype), no peft" if full else "fp32 adapters")
  lines = [title, "", f"Device: {device}. Command: `{command}`.",
           "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ".", "",
           f"Random weights and tokens, loss on all tokens, AdamW + clip 1.0, {what}, "
           f"{rows[0]['warmup']} warm-up + {rows[0]['steps']} timed steps, each case in a fresh process. "
           "peak GiB: JAX `peak_bytes_in_use` / `torch.cuda.max_memory_allocated` (after warm-up reset). "
           "XLA est.: arguments + outputs - donated + temporaries of the compiled step. "
           f"ratio: tokens/s over {ref_name} with matching recomputation (ckpt off <-> remat none).", "",
           markdown_table(header, table), "",
           (FLOPS_NOTE_FULL if full else FLOPS_NOTE).format(
               peak="unknown device: n/a" if peak is None else f"{peak / 1e12:.0f} TFLOP/s"),
           ""] + summary
  return "\n".join(lines)


def loop_ratios(rows: list[dict], peak) -> list[str]:
  """One line per fineflax setting run with both layer loops: unrolled vs scan tokens/s and MFU."""
  key = lambda r: (r["model"], r["remat"], r["logits_chunk"], r.get("causal_prefix", True))
  runs = {(key(r), r.get("layer_loop", "scan")): r for r in rows if r["framework"] == "fineflax"}
  lines = []
  for (k, loop), u in runs.items():
    s = runs.get((k, "scan"))
    if loop != "unrolled" or s is None:
      continue
    m = [mfu(step_flops(r), r["seconds"] / r["steps"], peak) for r in (s, u)]
    pct = " / ".join("n/a" if x is None else f"{100 * x:.1f}%" for x in m)
    lines.append(f"- {k[0]} {setting(dict(s, default=False))}: unrolled / scan layer loop tokens/s "
                 f"**{u['tokens_s'] / s['tokens_s']:.2f}x** (MFU scan / unrolled: {pct}; compile "
                 f"{s['compile_s']:.0f} / {u['compile_s']:.0f} s)")
  return lines


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--smoke", action="store_true", help="tiny shapes on any device; print only")
  p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; smoke 2)")
  p.add_argument("--warmup", type=int, default=None, help="untimed steps, the first compiles (default 3; smoke 1)")
  p.add_argument("--batch", type=int, default=None, help="override every model's batch size")
  p.add_argument("--seq", type=int, default=None, help="sequence length (default 1024; smoke 64)")
  p.add_argument("--models", nargs="*", default=None, help=f"subset of {list(SHAPES)}")
  p.add_argument("--frameworks", nargs="*", default=None, help="subset of fineflax, torch")
  p.add_argument("--torch-compile", action="store_true", help="add a torch.compile case per model")
  p.add_argument("--sweep", action="store_true", help="add remat=dots, logits_chunk=1024, masked attention")
  p.add_argument("--layer-loop", default="auto", choices=("auto", "scan", "unrolled", "both"),
                 help="model.layer_loop of the fineflax cases (auto: the config default, "
                      "layer_loop.resolve_layer_loop; both: each case with scan and with unrolled)")
  p.add_argument("--params", default="lora", choices=(*PARAMS, "both"),
                 help="train LoRA adapters (default) or every parameter (full), or both")
  p.add_argument("--section", default="sft",
                 help="RESULTS.md section of the LoRA cases (default sft); the full cases go to SECTION_full "
                      "(default sft_full)")
  p.add_argument("--out", default=str(pathlib.Path(__file__).with_name("out") / "sft.json"))
  p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    spec = json.loads(args.worker)
    gpu.print_result((fineflax_worker if spec["framework"] == "fineflax" else torch_worker)(spec))
    return 0
  args.steps = args.steps or (2 if args.smoke else 10)
  args.warmup = max(1, args.warmup or (1 if args.smoke else 3))
  command = "python -m benchmarks.sft " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
  rows, t_all = [], time.perf_counter()
  for c in cases(args):
    env = gpu.jax_env() if c["framework"] == "fineflax" else dict(os.environ)
    t = time.perf_counter()
    res = gpu.run_worker([*gpu.worker_argv(__spec__.name), "--worker", json.dumps(c)], env=env)
    row = dict(c, **res)
    if "seconds" in res:
      row["tokens_s"] = c["batch"] * c["seq"] * c["steps"] / res["seconds"]
    print(f"[sft] {c['params']} {c['model']} {c['framework']} {setting(c)}: "
          + (f"{row['tokens_s']:.0f} tokens/s, peak {gib(row['peak_bytes'])} GiB" if "tokens_s" in row
             else row.get("error", "?")) + f" ({time.perf_counter() - t:.0f}s wall)", file=sys.stderr, flush=True)
    rows.append(row)
  device = gpu.device_name()
  sections = []
  for params in dict.fromkeys(r["params"] for r in rows):
    section = args.section if params == "lora" else f"{args.section}_full"
    md = report([r for r in rows if r["params"] == params], device, command.strip(), args.smoke)
    if section not in ("sft", "sft_full"):
      md = md.replace("## SFT training throughput", f"## SFT training throughput ({section})", 1)
    print(md)
    if not args.smoke:
      write_section(section, md)
    sections.append(section)
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  atomic_write_json(out, {"device": device, "command": command.strip(), "smoke": args.smoke,
                          "wall_s": time.perf_counter() - t_all, "rows": rows})
  print(f"[sft] wrote {out}" + ("" if args.smoke else f" and RESULTS.md sections {sections}")
        + f" in {time.perf_counter() - t_all:.0f}s", file=sys.stderr)
  return 0 if all("tokens_s" in r for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
