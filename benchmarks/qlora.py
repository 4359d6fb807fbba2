"""QLoRA on one GPU: peak memory of a training step on 7B shapes, and step speed of QLoRA vs bf16 LoRA
vs transformers + peft.

  python -m benchmarks.qlora            # GPU (H100): about 5 minutes; writes the "qlora" section of RESULTS.md
  python -m benchmarks.qlora --smoke    # CPU check with tiny shapes; prints only (RESULTS.md untouched)
  python -m benchmarks.qlora --only speed --layer-loop both --skip-torch --section qlora_unroll  # scan vs unrolled

Every case: random weights of the model's shape built on the device layer by layer (bf16; NF4 = block 64 with
double quantisation, quantised on the device one layer at a time, so no 7B model ever sits in f32),
random tokens, loss on every token through `fineflax.train.sft_step` (jitted, LoRA/optimizer state donated;
logits in chunks of 256 positions, so [B, T, V] logits never exist), LoRA r=16 alpha=32 on q,k,v,o,gate,up,
down (f32 adapters, bf16 compute), AdamW + global-norm clip 1, remat "full" (checkpoint every layer; memory
cases also with `--remat full,offload`: the per-layer inputs in pinned host memory).
memory: seq 1024, batch 1, one step; peak = JAX `peak_bytes_in_use` since the worker process started
(weights, adapters, optimizer state, activations and XLA temporaries all included); with `--aot` (default
both) the step is also compiled from shapes before the weights exist, so XLA's autotuning scratch is not
stacked on the resident weights; workers never use the persistent compilation cache.
speed: Llama-3.2-1B shape, batch 4 x seq 1024, tokens/s = B*T*steps / time of `steps` steps after warm-up.
torch: `AutoModelForCausalLM.from_config` (bf16, sdpa) + peft `get_peft_model`, gradient checkpointing on
(matching remat "full"), fused AdamW, same GPU, same run. Each case runs in a fresh subprocess.
`--layer-loop` sets `model.layer_loop` of the fineflax cases (scan, unrolled, or both: each case once each).
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import time


from benchmarks import gpu
from benchmarks._random_weights import random_params
from benchmarks._results import markdown_table, write_section
from fineflax.models.flops import lora_step_flops, mfu, peak_bf16_flops

LORA_R, LORA_ALPHA, LR, LOGITS_CHUNK = 16, 32.0, 1e-4, 256
TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
HF_TARGETS = tuple(f"{t}_proj" for t in TARGETS)
LLAMA3_ROPE = (("factor", 32.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
               ("original_max_position_embeddings", 8192), ("rope_type", "llama3"))
MODELS = {  # fineflax ModelConfig fields
    "Llama-2-7B": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32,
                       num_heads=32, num_kv_heads=32, head_dim=128, rms_norm_eps=1e-5, rope_theta=1e4,
                       max_position_embeddings=4096),
    "Qwen2.5-7B": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                       num_heads=28, num_kv_heads=4, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                       attention_bias=True, model_type="qwen2", max_position_embeddings=32768),
    "Llama-3.2-1B": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
                         num_heads=32, num_kv_heads=8, head_dim=64, rms_norm_eps=1e-5, rope_theta=5e5,
                         rope_scaling=LLAMA3_ROPE, tie_word_embeddings=True, max_position_embeddings=131072),
}
SMOKE_MODELS = {  # same structure, tiny
    "Llama-2-7B": dict(MODELS["Llama-2-7B"], vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16),
    "Qwen2.5-7B": dict(MODELS["Qwen2.5-7B"], vocab_size=512, hidden_size=64, intermediate_size=192,
                       num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16),
    "Llama-3.2-1B": dict(MODELS["Llama-3.2-1B"], vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16),
}
MEMORY_TARGET_GB = {"Llama-2-7B": 5.0, "Qwen2.5-7B": 7.0}  # issue 17
SPEED_MODEL = "Llama-3.2-1B"


# ----------------------------------------------------------------------------- fineflax worker

def fineflax_worker(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax

  from fineflax.lora import LoraConfig, init_lora, lora_scale
  from fineflax.models import ModelConfig
  from fineflax.quant import bits_per_parameter, is_quantized
  from fineflax.train.sft_step import sft_step
  from fineflax.train.state import init_state

  if spec.get("nf4_matmul") == "plain":  # the old path: x @ W.dequantize(), dense W kept for the backward
    from fineflax.models import decoder
    decoder.matmul = lambda x, w, dtype: x @ decoder.materialize(w, dtype)
  config = dict(spec["config"])
  if config.get("rope_scaling"):  # JSON turned the tuple of pairs into lists; ModelConfig must be hashable
    config["rope_scaling"] = tuple(tuple(kv) for kv in config["rope_scaling"])
  mc = ModelConfig(**config)
  b, t = spec["batch"], spec["seq"]
  stages = {}  # stage -> (GB in use, GB peak so far): where the process peak happens

  def mark(stage):
    stats = jax.devices()[0].memory_stats() or {}  # in use, peak, and what live arrays hold
    stages[stage] = [round(v / 1e9, 3) for v in (stats.get("bytes_in_use", 0), stats.get("peak_bytes_in_use", 0),
                                                 sum(a.nbytes for a in jax.live_arrays()))]

  cfg = LoraConfig(r=LORA_R, alpha=LORA_ALPHA, target_modules=TARGETS)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(LR, weight_decay=0.0))
  train = jax.jit(functools.partial(
      sft_step, optimizer=optimizer, model_config=mc, lora_scale=lora_scale(cfg), lora_dropout=0.0,
      remat=spec["remat"], dtype=jnp.bfloat16, logits_chunk=spec.get("logits_chunk", LOGITS_CHUNK),
      causal_prefix=True),  # one unpadded sequence a row: plain causal attention
      donate_argnums=(0,) if spec.get("donate", True) else ())
  tokens = np.random.default_rng(0).integers(0, mc.vocab_size, size=(1, b, t + 1), dtype=np.int32)
  host_batch = {
      "tokens": tokens[..., :-1], "targets": tokens[..., 1:], "loss_mask": np.ones((1, b, t), np.float32),
      "attention_mask": np.ones((1, b, t), np.int32),
      "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (1, b, t)).copy()}
  make_params = lambda mark_=lambda stage: None: random_params(mc, spec["quant"], jax.random.PRNGKey(0),
                                                               jnp.bfloat16, mark_)
  make_state = lambda p: init_state(init_lora(p, mc, cfg, jax.random.PRNGKey(1)), optimizer, seed=0)

  def compile_step(state_, params_, batch_):
    t0 = time.perf_counter()
    out = train.lower(state_, params_, batch_).compile()
    return out, time.perf_counter() - t0

  if spec.get("aot"):  # compile from shapes before any weight exists
    params_shape = jax.eval_shape(make_params)
    compiled, compile_s = compile_step(jax.eval_shape(make_state, params_shape), params_shape,
                                       jax.eval_shape(lambda: jax.tree_util.tree_map(jnp.asarray, host_batch)))
    mark("compiled")
  params = make_params(mark)
  jax.block_until_ready(params)
  mark("weights")
  gc.collect()
  jax.clear_caches()  # the weight builders' executables are not part of training (the AOT step is kept)
  mark("weights_cleared")
  leaves = jax.tree_util.tree_leaves(params)
  param_bytes = sum(x.size * x.dtype.itemsize for x in leaves)
  kernel = params["layers"]["gate"]["kernel"]
  bits = bits_per_parameter(kernel) if is_quantized(kernel) else 16.0
  state = make_state(params)
  state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))
  batch = jax.device_put(host_batch)
  jax.block_until_ready((state, batch))
  mark("state")
  if not spec.get("aot"):
    compiled, compile_s = compile_step(state, params, batch)
    mark("compiled")
  mem = compiled.memory_analysis()
  temp_bytes = None if mem is None else int(mem.temp_size_in_bytes)
  dt, loss = gpu.time_jax_steps(compiled, state, params, batch, warmup=spec["warmup"], steps=spec["steps"])
  mark("steps")
  return {"seconds": dt, "compile_s": compile_s, "loss": loss, "peak_bytes": gpu.jax_peak_bytes(),
          "xla_temp_bytes": temp_bytes, "param_bytes": int(param_bytes), "bits": bits,
          "state_bytes": int(state_bytes), "stages_gb": stages,
          "device": gpu.jax_device_name(), "versions": {"jax": jax.__version__}}


# ----------------------------------------------------------------------------- torch worker

def torch_worker(spec: dict) -> dict:
  import peft
  import torch
  import transformers

  c, b, t = spec["config"], spec["batch"], spec["seq"]
  cuda = torch.cuda.is_available()
  device = torch.device("cuda" if cuda else "cpu")
  torch.manual_seed(0)
  rope = dict(c.get("rope_scaling") or (("rope_type", "default"),), rope_theta=c["rope_theta"])
  hf = transformers.LlamaConfig(
      vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
      num_hidden_layers=c["num_layers"], num_attention_heads=c["num_heads"],
      num_key_value_heads=c["num_kv_heads"], head_dim=c["head_dim"], rope_parameters=rope,
      tie_word_embeddings=c.get("tie_word_embeddings", False),
      max_position_embeddings=c["max_position_embeddings"], rms_norm_eps=c["rms_norm_eps"], use_cache=False)
  with device:
    model = transformers.AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16, attn_implementation="sdpa")
  model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
  model = peft.get_peft_model(model, peft.LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                                     target_modules=list(HF_TARGETS), task_type="CAUSAL_LM"))
  model.train()
  tokens = torch.randint(0, c["vocab_size"], (b, t), device=device)
  return gpu.time_torch_lora_steps(model, model, tokens, lr=LR, warmup=spec["warmup"], steps=spec["steps"])


# ----------------------------------------------------------------------------- orchestration

def cases(args) -> list[dict]:
  models = SMOKE_MODELS if args.smoke else MODELS
  seq = 32 if args.smoke else 1024
  loops = ("scan", "unrolled") if args.layer_loop == "both" else (args.layer_loop,)
  out = []
  variant = dict(nf4_matmul=args.nf4_matmul, logits_chunk=args.logits_chunk, preallocate=args.preallocate)
  aots = {"both": (True, False), "yes": (True,), "no": (False,)}[args.aot]
  quants = args.quants.split(",")
  remats = args.remat.split(",")
  for name in MEMORY_TARGET_GB:
    for quant in quants:
      for loop in loops:
        for remat in (remats if quant == "nf4" else remats[:1]):  # bf16: the first policy only
          for aot in (aots if quant == "nf4" else aots[:1]):  # bf16: the first order only
            out.append(dict(part="memory", model=name, config=dict(models[name], layer_loop=loop),
                            framework="fineflax", quant=quant, batch=1, seq=seq, steps=2, warmup=1,
                            remat=remat, aot=aot, **variant))
  speed = dict(part="speed", model=SPEED_MODEL, config=models[SPEED_MODEL], batch=2 if args.smoke else 4,
               seq=seq, steps=2 if args.smoke else args.steps, warmup=1 if args.smoke else 2)
  out += [dict(speed, config=dict(speed["config"], layer_loop=loop), framework="fineflax", quant=quant,
               remat="full", **variant) for quant in quants for loop in loops]
  if not args.skip_torch:
    out.append(dict(speed, framework="torch", quant="none"))
  return out


def step_flops(r: dict) -> float:
  """Model FLOPs of one step of a speed case (`fineflax.models.flops.lora_step_flops`)."""
  from fineflax.models import ModelConfig
  config = dict(r["config"], rope_scaling=None)  # no effect on FLOPs; JSON turned it into lists
  return lora_step_flops(ModelConfig(**config), r["batch"], r["seq"], LORA_R, TARGETS)["total"]


FLOPS_NOTE = ("MFU = model FLOPs / step time / the GPU's dense bf16 peak ({peak}); model FLOPs as under the SFT "
              "table (`fineflax.models.flops.lora_step_flops`: forward + input-gradient matmuls of the frozen "
              "linears and head, adapters' forward and gradients, causal attention), remat recomputation not "
              "counted (remat full runs each layer's forward twice: about 1.5x the counted matmul work).")


def gb(x) -> str:
  return "n/a" if x is None else f"{x / 1e9:.2f}"


def label(r: dict) -> str:
  if r["framework"] == "torch":
    return "transformers + peft bf16 LoRA (grad ckpt)"
  loop = r.get("config", {}).get("layer_loop", "scan")
  return ("fineflax " + ("QLoRA (NF4 + double quant)" if r["quant"] == "nf4" else "bf16 LoRA")
          + (", unrolled layers" if loop == "unrolled" else ""))


def report(rows: list[dict], device: str, command: str, smoke: bool) -> str:
  mem = {(r["model"], r["quant"], r.get("remat", "full"), bool(r.get("aot"))): r for r in rows
         if r["part"] == "memory" and r["config"].get("layer_loop", "scan") == "scan"}  # scan (see mem_loops)
  mem_loops = [f"- {r['model']} {label(r)}: peak {gb(r.get('peak_bytes'))} GB" for r in rows
               if r["part"] == "memory" and r["config"].get("layer_loop") == "unrolled"]
  peak = lambda r: gb(r.get("peak_bytes")) if "error" not in r else "error: " + r["error"][:60]
  remats = list(dict.fromkeys(r.get("remat", "full") for r in rows if r["part"] == "memory" and r["quant"] == "nf4"))
  mem_rows = []
  for name, target in MEMORY_TARGET_GB.items():
    for remat in remats:
      step, cold = mem.get((name, "nf4", remat, True), {}), mem.get((name, "nf4", remat, False), {})
      d = next((r for (m, q, _, _), r in mem.items() if m == name and q == "none"), {})
      judged = step if step.get("peak_bytes") else cold
      ok = "error" not in judged and judged.get("peak_bytes") is not None
      step_s = judged["seconds"] / judged["steps"] if "seconds" in judged else None
      mem_rows.append([name, remat, peak(step) if step else "-", peak(cold) if cold else "-",
                       gb(judged.get("param_bytes")), gb(judged.get("state_bytes")),
                       gb(judged.get("xla_temp_bytes")), "n/a" if step_s is None else f"{step_s:.2f}",
                       f"{judged.get('bits', float('nan')):.3f}", peak(d), f"<= {target:g}",
                       ("yes" if judged["peak_bytes"] / 1e9 <= target else "**no**") if ok else "n/a"])
  speed = {label(r): r for r in rows if r["part"] == "speed"}
  spd_rows, tps = [], {}
  peak = peak_bf16_flops(device)
  for name, r in speed.items():
    if "error" in r:
      spd_rows.append([name, "error: " + r["error"][:80], "", "", "", ""])
      continue
    tps[name] = r["tokens_s"]
    u = mfu(step_flops(r), r["seconds"] / r["steps"], peak)
    spd_rows.append([name, round(r["tokens_s"]), round(1000 * r["seconds"] / r["steps"], 1),
                     "n/a" if u is None else f"{100 * u:.1f}%", gb(r["peak_bytes"]), round(r["compile_s"], 1)])
  name = {(quant, loop): label({"framework": "fineflax", "quant": quant, "config": {"layer_loop": loop}})
          for quant in ("nf4", "none") for loop in ("scan", "unrolled")}
  b_name, t_name = name["none", "scan"], label({"framework": "torch"})
  ratios = []
  for loop, prefix in (("scan", ""), ("unrolled", "unrolled layers: ")):
    q, b = name["nf4", loop], name["none", loop]
    if q in tps and b in tps:
      ratio = tps[q] / tps[b]
      ratios.append(f"- {prefix}QLoRA / bf16 LoRA tokens/s: **{ratio:.2f}x** (target >= 1.0x: "
                    f"{'met' if ratio >= 1.0 else 'missed'})")
  for quant in ("nf4", "none"):
    s_name, u_name = name[quant, "scan"], name[quant, "unrolled"]
    if s_name in tps and u_name in tps:
      ratios.append(f"- {u_name} / scan tokens/s: **{tps[u_name] / tps[s_name]:.2f}x**")
  if b_name in tps and t_name in tps:
    ratios.append(f"- fineflax bf16 LoRA / transformers + peft: **{tps[b_name] / tps[t_name]:.2f}x** "
                  "(target >= 1.3x)")
  versions = {}
  for r in rows:
    versions.update(r.get("versions", {}))
  sp = next((r for r in rows if r["part"] == "speed"), {})
  sp_variant = next((r for r in rows if r["framework"] == "fineflax"), {})
  title = "## QLoRA: memory and speed" + (" — SMOKE (tiny shapes, CPU; numbers meaningless)" if smoke else "")
  return "\n".join([
      title, "", f"Device: {device}. Command: `{command}`.",
      "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ".", "",
      *(["Peak memory of a training step (seq 1024, batch 1, LoRA r=16 on all linears, AdamW; "
         "random weights; JAX `peak_bytes_in_use` of a fresh process, GB = 1e9 bytes). step peak: the step "
         "compiled from shapes before the weights exist (`--aot yes`), so the process peak is the step's own; "
         "first-call peak: compiled after the weights are built, as a first jit call does, which adds XLA's "
         "autotuning scratch buffers (allocated while the weights are resident) when they exceed the step's "
         "temporaries. weights: bytes of the base parameters; state: LoRA + AdamW (f32); temporaries: XLA's "
         "compiled plan of the step; bits/param: of the NF4 linear kernels. The target is judged on the step "
         "peak.", "",
         markdown_table(["model shape", "remat", "QLoRA step peak GB", "QLoRA first-call peak GB", "weights GB",
                         "state GB", "step temporaries GB", "step s", "bits/param", "bf16 LoRA peak GB (remat "
                         "full)", "target GB", "met"], mem_rows), "",
         ("Allocator: JAX's default (`XLA_PYTHON_CLIENT_PREALLOCATE=true`: one region of 75% of the GPU, from "
          "which `peak_bytes_in_use` counts the bytes handed out). " if sp_variant.get("preallocate") else
          "Allocator grown on demand (`XLA_PYTHON_CLIENT_PREALLOCATE=false`): its region boundaries leave "
          "chunks up to 2x a request unsplit, counted as in use (0.12-0.29 GB more than the live arrays for "
          "these 7B builds). ") +
         "remat: `model.remat` of the QLoRA step (full: every layer recomputed, its input kept on the device; "
         "offload: the same with the per-layer inputs in pinned host memory). step s: seconds of the second "
         "step (one warm-up step first).", "",
         f"NF4 linears: `{sp_variant.get('nf4_matmul')}` matmul ("
         + ("`fineflax.quant.quantized_matmul`: W dequantised again in the backward pass, no dense W kept"
            if sp_variant.get("nf4_matmul") == "custom" else "x @ W.dequantize(): the dense W is autodiff's "
            "residual") + f"); loss head in chunks of {sp_variant.get('logits_chunk')} positions.", ""]
        if any(r["part"] == "memory" for r in rows) else []),
      *([f"Training step speed, {SPEED_MODEL} shape, batch {sp.get('batch')} x seq {sp.get('seq')}, "
         f"{sp.get('warmup')} warm-up + {sp.get('steps')} timed steps (remat full / gradient checkpointing on):",
         "", markdown_table(["case", "tokens/s", "step ms", "MFU", "peak GB", "compile / 1st step s"], spd_rows),
         "", FLOPS_NOTE.format(peak="unknown device: n/a" if peak is None else f"{peak / 1e12:.0f} TFLOP/s"), ""]
        if sp else []),
      *ratios, *(["", "Peak memory with the unrolled layer loop:"] + mem_loops if mem_loops else [])])


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU; print only")
  ap.add_argument("--steps", type=int, default=10, help="timed steps of the speed cases")
  ap.add_argument("--only", choices=("memory", "speed"), help="run one part")
  ap.add_argument("--layer-loop", default="scan", choices=("scan", "unrolled", "both"),
                  help="model.layer_loop of the fineflax cases (both: each case with each)")
  ap.add_argument("--skip-torch", action="store_true", help="no transformers + peft speed case")
  ap.add_argument("--section", default="qlora", help="RESULTS.md section to write (default qlora)")
  ap.add_argument("--quants", default="nf4,none", help="comma list of base weights: nf4, none (bf16)")
  ap.add_argument("--nf4-matmul", default="custom", choices=("custom", "plain"),
                  help="custom: fineflax.quant.quantized_matmul (default); plain: x @ W.dequantize() (the old "
                       "path, dense W saved for the backward)")
  ap.add_argument("--aot", default="both", choices=("both", "yes", "no"),
                  help="memory cases: compile the step from shapes before building the weights (yes), after "
                       "them as a first jit call does (no), or each NF4 case both ways (default)")
  ap.add_argument("--remat", default="full",
                  help="comma list of model.remat policies of the NF4 memory cases (full, offload: the per-layer "
                       "inputs in pinned host memory); the bf16 case takes the first")
  ap.add_argument("--preallocate", action="store_true",
                  help="workers run with JAX's default allocator settings (XLA_PYTHON_CLIENT_PREALLOCATE=true: one "
                       "region of 75%% of the GPU) instead of growing the allocator on demand")
  ap.add_argument("--logits-chunk", type=int, default=LOGITS_CHUNK, help="positions per loss-head chunk")
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    spec = json.loads(args.worker)
    result = torch_worker(spec) if spec["framework"] == "torch" else fineflax_worker(spec)
    gpu.print_result(result)
    return
  command = " ".join(["python -m benchmarks.qlora"] + sys.argv[1:])
  rows = []
  for case in cases(args):
    if args.only and case["part"] != args.only:
      continue
    t0 = time.perf_counter()
    env = gpu.jax_env(JAX_PLATFORMS="cpu") if args.smoke else gpu.jax_env()
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # every case compiles (and autotunes) from scratch
    if case.get("preallocate"):
      env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true"
    if args.smoke and case["framework"] == "torch":
      env["CUDA_VISIBLE_DEVICES"] = ""
    result = gpu.run_worker([*gpu.worker_argv(__spec__.name), "--worker", json.dumps(case)], env=env)
    row = dict(case, **result)
    if "seconds" in row:
      row["tokens_s"] = case["batch"] * case["seq"] * case["steps"] / row["seconds"]
    rows.append(row)
    summary = {k: row.get(k) for k in ("peak_bytes", "tokens_s", "compile_s", "loss", "error", "stages_gb")}
    summary["aot"] = case.get("aot")
    print(f"[{time.perf_counter() - t0:6.1f}s] {case['part']} {case['model']} {label(case)}: {summary}",
          file=sys.stderr, flush=True)
    md = report(rows, gpu.device_name(), command, args.smoke)
    if args.section != "qlora":
      md = md.replace("## QLoRA: memory and speed", f"## QLoRA: memory and speed ({args.section})", 1)
    if not args.smoke:  # after every case: a run cut short keeps what it measured
      write_section(args.section, md)
  print(md)


if __name__ == "__main__":
  main()
