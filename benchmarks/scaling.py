"""Multi-GPU scaling of the SFT and GRPO steps on a ("data", "fsdp") mesh, and the largest QLoRA GRPO step
that fits 4 GPUs with fsdp = 4.

  python -m benchmarks.scaling --out DIR            # GPUs: 1, 2 and 4 devices (as many as are visible)
  python -m benchmarks.scaling --out DIR --tiny     # CPU check: tiny shapes on 1/2/4 forced CPU devices
  python -m benchmarks.scaling --out DIR --results  # also writes the "multi-GPU" section of RESULTS.md

Every case runs in a fresh subprocess that sees n devices (CUDA_VISIBLE_DEVICES=0..n-1; on CPU
--xla_force_host_platform_device_count=n) and builds the mesh data=n (fsdp=1) for the scaling rows.
Weights are random of the named shape, bf16 compute (f32 on CPU), LoRA r=16 on every linear.

  sft    Llama-3.2-1B shape, seq 1024, `--sft_batch` rows per device: `make_sft_fns` train step
         (fineflax.jobs.sft's), batch split over the mesh. tokens/s = rows * seq * steps / time.
  grpo   SmolLM2-135M and Llama-3.2-1B shapes, NF4 base (QLoRA): one RL step = rollouts (fineflax
         generate, rows and KV cache split over the mesh, group 8, 128 new tokens, no early EOS,
         prompts of 64 random tokens) + random rewards
         + group advantages + old log-probs + one update (fineflax.rl.update.rl_update on the mesh).
         `--grpo_prompts` groups per device. samples/s = rows * steps / time (rollouts included).
  fits   Llama-3.1-70B shape (then smaller published shapes until one fits), NF4 base split over
         fsdp=4, one group of 8 rows, 128 new tokens: does one GRPO step run; peak memory per device.
         --fits_model M: rollouts tensor-parallel over M devices (the RL jobs' config.mesh.model: the base
         laid out once for the rollouts with `engine.tensor_parallel.shard_decode_params`, as the Learner
         does; the update keeps fsdp), and the row reports rollout s, update s, decode ms a step (rollout time
         less the least of three 1-token rollouts, over new - 1 steps; --tiny decodes 32 tokens) against the
         per-device weight-read time (the rollout weights' bytes on the busiest device / the device's copy
         bandwidth; target: decode <= 3x it).

  python -m benchmarks.scaling --out DIR --only none --fits_fsdp 4 --fits_model 4   # 70B step, 4 GPUs, TP=4
  python -m benchmarks.scaling --out DIR --only none --fits_fsdp 4 --fits_model 2 --tiny  # CPU check

speedup(n) = throughput(n) / throughput(1) at the same per-device batch; efficiency = speedup / n.
The table is rewritten (DIR/scaling.md, DIR/scaling.jsonl) after every case.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time


from benchmarks import gpu
from benchmarks._results import markdown_table, write_section
from fineflax.io import atomic_write_text

SHAPES = {  # published shapes (config.json of each model)
    "SmolLM2-135M": dict(vocab=49152, hidden=576, inter=1536, layers=30, heads=9, kv_heads=3, head_dim=64,
                         tie=True),
    "Llama-3.2-1B": dict(vocab=128256, hidden=2048, inter=8192, layers=16, heads=32, kv_heads=8, head_dim=64,
                         tie=True),
    "Llama-3.1-8B": dict(vocab=128256, hidden=4096, inter=14336, layers=32, heads=32, kv_heads=8,
                         head_dim=128, tie=False),
    "Qwen2.5-32B": dict(vocab=152064, hidden=5120, inter=27648, layers=64, heads=40, kv_heads=8, head_dim=128,
                        tie=False),
    "Llama-3.1-70B": dict(vocab=128256, hidden=8192, inter=28672, layers=80, heads=64, kv_heads=8,
                          head_dim=128, tie=False),
}
TINY = dict(vocab=512, hidden=64, inter=128, layers=2, heads=4, kv_heads=2, head_dim=16, tie=True)
TINY_TP = dict(TINY, hidden=128, inter=256, head_dim=64)  # NF4 column kernels split over 2 devices x 64-blocks
FITS_ORDER = ("Llama-3.1-70B", "Qwen2.5-32B", "Llama-3.1-8B")


# ----------------------------------------------------------------------------- worker (one case)

def _model_config(s, max_len):
  from fineflax.models import ModelConfig
  return ModelConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["inter"],
                     num_layers=s["layers"], num_heads=s["heads"], num_kv_heads=s["kv_heads"],
                     head_dim=s["head_dim"], tie_word_embeddings=s["tie"], eos_token_ids=(0,),
                     max_position_embeddings=max(max_len, 2048))


def random_params(mc, mesh, dtype, quant: str):
  """Random weights of `mc`'s shape (NF4 codes when quant="nf4"), each leaf generated directly in its
  place on the mesh (big leaves split over fsdp): no dense copy of a 70B model ever exists."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding
  from fineflax.models.quantize import quantize_params
  from fineflax.models import init_params
  from fineflax.mesh import _fsdp_spec
  make = lambda: init_params(mc, jax.random.PRNGKey(0), dtype=dtype)
  abstract = jax.eval_shape(lambda: quantize_params(make(), kind=quant) if quant != "none" else make())
  leaves, tree = jax.tree.flatten(abstract)
  out = []
  for i, x in enumerate(leaves):
    sharding = NamedSharding(mesh, _fsdp_spec(x, mesh.shape["fsdp"]))
    def gen(key, x=x):
      if jnp.issubdtype(x.dtype, jnp.integer):
        return jax.random.randint(key, x.shape, 0, 16 if x.dtype == jnp.uint8 else 127).astype(x.dtype)
      return (0.02 * jax.random.normal(key, x.shape, jnp.float32)).astype(x.dtype)  # zero-mean: no drift
    out.append(jax.jit(gen, out_shardings=sharding)(jax.random.PRNGKey(i)))
  return jax.tree.unflatten(tree, out)


def _lora(params, mc, mesh):
  import jax
  from fineflax import lora as L
  from fineflax.mesh import replicate
  cfg = L.LoraConfig(r=16, alpha=32.0)
  return replicate(L.init_lora(params, mc, cfg, jax.random.PRNGKey(1)), mesh), L.lora_scale(cfg)


def _peak_gib() -> float | None:
  import jax
  peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
  peaks = [p for p in peaks if p]
  return max(peaks) / gpu.GIB if peaks else None


def sft_worker(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from fineflax.mesh import make_mesh, shard_batch, shard_params
  from fineflax.train.sft_step import make_sft_fns
  from fineflax.train.state import init_state
  from fineflax.mesh import replicate
  n, t, dtype = jax.device_count(), spec["seq"], jnp.dtype(spec["dtype"])
  mesh = make_mesh(data=n, fsdp=1)
  mc = _model_config(spec["shape"], t)
  params = random_params(mc, mesh, dtype, "none")
  lora, scale = _lora(params, mc, mesh)
  opt = optax.adamw(1e-4)
  train, _ = make_sft_fns(opt, model_config=mc, lora_scale=scale, remat=spec["remat"], dtype=dtype,
                          logits_chunk=256)
  state = replicate(init_state(lora, opt, 0), mesh)
  b = spec["per_device"] * n
  tok = np.random.default_rng(0).integers(0, mc.vocab_size, (1, b, t + 1), dtype=np.int32)
  batch = {"tokens": tok[..., :-1], "targets": tok[..., 1:], "loss_mask": np.ones((1, b, t), np.float32),
           "attention_mask": np.ones((1, b, t), np.int32), "segment_ids": np.ones((1, b, t), np.int32),
           "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (1, b, t)).copy()}
  batch = shard_batch(batch, mesh, batch_axis=1)
  dt, loss = gpu.time_jax_steps(train, state, params, batch, warmup=spec["warmup"], steps=spec["steps"])
  return {"devices": n, "rows": b, "seconds": dt, "throughput": b * t / dt, "loss": loss,
          "peak_gib": _peak_gib(), "device": gpu.jax_device_name()}


def grpo_worker(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from fineflax.rl import rows as R
  from fineflax.rl.objectives import common_kwargs
  from fineflax.rl.step import make_rl_fns
  from fineflax.rl.update import rl_update, update_batch
  from fineflax.sampling import generate
  from fineflax.mesh import make_mesh, replicate
  from fineflax.train.state import init_state
  import ml_collections
  n, g, new, dtype = jax.device_count(), spec["group"], spec["new_tokens"], jnp.dtype(spec["dtype"])
  fsdp, tp_n = spec.get("fsdp", 1), spec.get("tp", 1)
  mesh = make_mesh(data=n // fsdp, fsdp=fsdp)
  mc = _model_config(spec["shape"], spec["prompt_len"] + new)
  base = random_params(mc, mesh, dtype, "nf4")
  decode_base, roll_mesh, extra = base, mesh, {}
  if tp_n > 1:  # the Learner's rollout layout (config.mesh.model), made once
    from fineflax.engine import tensor_parallel as tp
    from fineflax.mesh import rollout_mesh
    t = time.perf_counter()
    roll_mesh = rollout_mesh(tp_n, mesh.devices)
    decode_base = tp.shard_decode_params(base, mc, roll_mesh)
    jax.block_until_ready(decode_base)
    extra["layout_s"] = time.perf_counter() - t
    extra["rollout_weights_gib"] = max(tp.bytes_per_device(decode_base).values()) / gpu.GIB
  lora, scale = _lora(base, mc, mesh)
  rl = ml_collections.ConfigDict(dict(epsilon_low=0.2, epsilon_high=0.28, dual_clip=0.0, beta=0.0,
                                      entropy_coef=0.0, agg_mode="token-mean", max_new_tokens=new,
                                      importance="none", importance_level="token", importance_cap=2.0))
  opt = optax.adamw(1e-5)
  step_fn, logp_fn = make_rl_fns(opt, objective="grpo", loss_kwargs=dict(common_kwargs(rl), clip=True),
                                 fwd_kwargs=dict(model_config=mc, lora_scale=scale, dtype=dtype,
                                                 remat=spec["remat"], logits_chunk=128))
  state = replicate(init_state(lora, opt, 0), mesh)
  groups = spec["per_device"] * (n // fsdp) if fsdp == 1 else spec["per_device"]
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(1, mc.vocab_size, spec["prompt_len"])) for _ in range(groups)]
  rows_prompts = [p for p in prompts for _ in range(g)]
  times = {"rollout": 0.0, "update": 0.0}

  def rollout(new_tokens, i):
    return generate(decode_base, mc, rows_prompts, max_new_tokens=new_tokens, temperature=1.0,
                    rng=jax.random.PRNGKey(i), lora=state["params"], lora_scale=scale, dtype=dtype, eos_ids=(),
                    mesh=roll_mesh)

  def one_step(i):
    nonlocal state
    t0 = time.perf_counter()
    out = rollout(new, i)
    comps = [list(out.tokens[j, :out.lengths[j]]) for j in range(len(rows_prompts))]
    rows = R.make_rows(rows_prompts, comps, [[1.0] * len(c) for c in comps], [""] * len(comps),
                       off_policy=False)
    t1 = time.perf_counter()
    batch = update_batch(rows, rng.integers(0, 2, len(comps)).astype(np.float32), np.ones(groups, bool),
                         group_size=g, pad_id=0, max_new_tokens=new, advantage_scale="group", fields=())
    state, metrics = rl_update(state, base, batch, step_fn=step_fn, logp_fn=logp_fn, beta=0.0,
                               num_iterations=1, mesh=mesh)
    return t1 - t0, time.perf_counter() - t1, metrics["loss"]

  for i in range(spec["warmup"]):
    one_step(i)
  t0 = time.perf_counter()
  for i in range(spec["steps"]):
    r, u, loss = one_step(100 + i)
    times["rollout"] += r
    times["update"] += u
  dt = (time.perf_counter() - t0) / spec["steps"]
  if tp_n > 1:  # decode ms a step = (rollout - a 1-token rollout) / (new - 1), vs the weight read
    rollout(1, 0)
    first = float("inf")  # the least of 3 (prefill only, cheap): a stall of the host cannot inflate it
    for i in range(1, 4):
      t = time.perf_counter()
      rollout(1, i)
      first = min(first, time.perf_counter() - t)
    extra["decode_ms"] = 1e3 * (times["rollout"] / spec["steps"] - first) / max(new - 1, 1)
    bw = gpu.jax_copy_bandwidth(256 * 2 ** 20 if spec["dtype"] == "bfloat16" else 2 ** 22)
    extra["weight_read_ms"] = 1e3 * extra["rollout_weights_gib"] * gpu.GIB / bw
    extra["decode_over_read"] = extra["decode_ms"] / extra["weight_read_ms"]
  return {**extra, "model_axis": tp_n, "devices": n, "rows": len(rows_prompts), "seconds": dt, "throughput": len(rows_prompts) / dt,
          "rollout_s": times["rollout"] / spec["steps"], "update_s": times["update"] / spec["steps"],
          "loss": loss, "peak_gib": _peak_gib(), "device": gpu.jax_device_name()}


WORKERS = {"sft": sft_worker, "grpo": grpo_worker}


# ----------------------------------------------------------------------------- driver

def _env(n: int, tiny: bool) -> dict:
  if tiny:
    return gpu.jax_env(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
  return gpu.jax_env(CUDA_VISIBLE_DEVICES=",".join(map(str, range(n))))


def run_case(spec: dict, n: int, tiny: bool, timeout: float) -> dict:
  argv = [*gpu.worker_argv(__spec__.name), "--worker", json.dumps(spec)]
  return gpu.run_worker(argv, env=_env(n, tiny), timeout=timeout)


def cases(args) -> list[dict]:
  tiny = args.tiny
  common = dict(dtype="float32" if tiny else "bfloat16", warmup=1 if tiny else 2, steps=2 if tiny else 5)
  sft_shape = TINY if tiny else SHAPES["Llama-3.2-1B"]
  out = [dict(common, kind="sft", model="tiny" if tiny else "Llama-3.2-1B", shape=sft_shape,
              seq=64 if tiny else 1024, per_device=2 if tiny else args.sft_batch,
              remat="none" if tiny else "dots")]
  for name in (("tiny",) if tiny else ("SmolLM2-135M", "Llama-3.2-1B")):
    out.append(dict(common, kind="grpo", model=name, shape=TINY if tiny else SHAPES[name],
                    group=4 if tiny else 8, new_tokens=8 if tiny else 128, prompt_len=16 if tiny else 64,
                    per_device=1 if tiny else args.grpo_prompts, remat="none" if tiny else "dots"))
  return out


def _table(results: list[dict]) -> str:
  base = {(r["kind"], r["model"]): r["throughput"] for r in results if r.get("devices") == 1 and "throughput" in r}
  rows = []
  for r in results:
    if r["kind"] == "fits":
      peak = r.get("peak_gib")
      ran = "runs" if "error" not in r else "error: " + r["error"][:80]
      if "decode_ms" in r:  # tensor-parallel rollouts: the phase times and decode vs the weight read
        ran += (f"; rollout {r['rollout_s']:.2f} s, update {r['update_s']:.2f} s, decode {r['decode_ms']:.2f} "
                f"ms/step = {r['decode_over_read']:.2f}x the weight read ({r['weight_read_ms']:.2f} ms of "
                f"{r['rollout_weights_gib']:.2f} GiB)")
      rows.append([r["kind"], r["model"], r.get("devices", "-"), r.get("rows", "-"), ran, "-", "-",
                   "-" if peak is None else peak])
      continue
    if "error" in r:
      rows.append([r["kind"], r["model"], r["n"], "-", "-", "-", "-", "error: " + r["error"][:80]])
      continue
    speed = r["throughput"] / base[(r["kind"], r["model"])] if (r["kind"], r["model"]) in base else float("nan")
    unit = "tokens/s" if r["kind"] == "sft" else "samples/s"
    rows.append([r["kind"], r["model"], r["devices"], r["rows"], f"{r['throughput']:.4g} {unit}", speed,
                 speed / r["devices"], r.get("peak_gib") if r.get("peak_gib") is not None else "-"])
  return markdown_table(["step", "model", "devices", "rows/step", "throughput", "speedup", "efficiency",
                         "peak GiB/device"], rows)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", help="folder for scaling.md / scaling.jsonl (required)")
  p.add_argument("--tiny", action="store_true", help="tiny shapes on forced CPU devices")
  p.add_argument("--devices", default="1,2,4")
  p.add_argument("--sft_batch", type=int, default=4, help="SFT rows per device")
  p.add_argument("--grpo_prompts", type=int, default=2, help="GRPO groups (prompts) per device")
  p.add_argument("--skip_fits", action="store_true", help="skip the largest-model search")
  p.add_argument("--fits_fsdp", type=int, default=4, help="devices (= fsdp) of the largest-model search")
  p.add_argument("--fits_model", type=int, default=1,
                 help="largest-model search: rollouts tensor-parallel over this many devices (config.mesh.model)")
  p.add_argument("--only", default="", help="comma list of cases to run, e.g. grpo:Llama-3.2-1B,sft (default all)")
  p.add_argument("--results", action="store_true", help="write the multi-GPU section of RESULTS.md")
  p.add_argument("--timeout", type=float, default=1800)
  p.add_argument("--worker")
  args = p.parse_args()
  if args.worker:
    spec = json.loads(args.worker)
    gpu.print_result(WORKERS[spec["kind"]](spec))
    return
  if not args.out:
    p.error("--out DIR is required")
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  devices = [int(d) for d in args.devices.split(",")]
  results: list[dict] = []
  name = "2-core CPU (forced host devices)" if args.tiny else gpu.device_name()

  def record(r):
    results.append(r)
    print(json.dumps(r), flush=True)
    with open(out / "scaling.jsonl", "a") as f:
      f.write(json.dumps(r) + "\n")
    cmd = "python -m benchmarks.scaling " + " ".join(sys.argv[1:])
    text = f"Device: {name}. Command: `{cmd}`.\n\n{_table(results)}\n"
    atomic_write_text(out / "scaling.md", text)
    return text

  text = ""
  only = [c for c in args.only.split(",") if c]
  for spec in cases(args):
    if only and not any(c in (spec["kind"], f"{spec['kind']}:{spec['model']}") for c in only):
      continue
    for n in devices:
      r = run_case(spec, n, args.tiny, args.timeout)
      text = record({"kind": spec["kind"], "model": spec["model"], "n": n, **r})
  if not args.skip_fits:
    for model in (("tiny",) if args.tiny else FITS_ORDER):
      k = args.fits_fsdp
      tiny = TINY_TP if args.fits_model > 1 else TINY
      spec = dict(kind="grpo", model=model, shape=tiny if args.tiny else SHAPES[model], group=8, fsdp=k,
                  **({"tp": args.fits_model} if args.fits_model > 1 else {}),
                  new_tokens=32 if args.tiny else 128, prompt_len=16 if args.tiny else 64, per_device=1,
                  remat="full", dtype="float32" if args.tiny else "bfloat16", warmup=1, steps=1)
      r = run_case(spec, k, args.tiny, args.timeout)
      tp_note = f", model={args.fits_model}" if args.fits_model > 1 else ""
      text = record({"kind": "fits", "model": f"{model} (fsdp={k}{tp_note})", "n": k, **r})
      if "error" not in r:
        break
  if args.results:
    write_section("multi-gpu", "## Multi-GPU scaling (benchmarks/scaling.py)\n\n" + text)


if __name__ == "__main__":
  main()
