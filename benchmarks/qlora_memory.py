"""XLA's compiled memory plan of the QLoRA training step on 7B shapes, on any backend (CPU included).

  python -m benchmarks.qlora_memory                       # both 7B shapes, NF4, seq 1024, batch 1, remat full
  python -m benchmarks.qlora_memory --models Llama-2-7B --logits-chunk 64

The step is `benchmarks/qlora.py`'s (same shapes, LoRA, optimizer, remat full, logits chunk 256), lowered
on abstract inputs (`jax.eval_shape`: no weights are made) and compiled; `memory_analysis()` gives the
buffer sizes XLA planned: arguments (weights, LoRA, optimizer state, batch), outputs, aliased (donated)
bytes and temporaries. peak plan = arguments + outputs - aliased + temporaries, the most the step can hold
at once. On CPU the plan differs from the GPU's (no cuDNN attention: XLA attention keeps [B, H, T, T]
f32 scores of one layer), so compare variants on the same backend; `benchmarks/qlora.py` measures the
GPU's real peak.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time


from benchmarks._random_weights import random_params
from benchmarks.qlora import LORA_ALPHA, LORA_R, LR, MEMORY_TARGET_GB, MODELS, TARGETS


def plan(name: str, seq: int, batch: int, remat: str, logits_chunk: int, quant: str = "nf4",
         dtype: str = "bfloat16") -> dict:
  """{"args", "outputs", "aliased", "temp", "peak_plan", "compile_s"} in bytes for one compiled step."""
  import jax
  import jax.numpy as jnp
  import optax

  from fineflax.lora import LoraConfig, init_lora, lora_scale
  from fineflax.models import ModelConfig
  from fineflax.train.sft_step import sft_step
  from fineflax.train.state import init_state

  mc = ModelConfig(**MODELS[name])
  params = jax.eval_shape(lambda k: random_params(mc, quant, k, jnp.bfloat16), jax.random.PRNGKey(0))
  cfg = LoraConfig(r=LORA_R, alpha=LORA_ALPHA, target_modules=TARGETS)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(LR, weight_decay=0.0))
  state = jax.eval_shape(lambda p, k: init_state(init_lora(p, mc, cfg, k), optimizer, 0), params,
                         jax.random.PRNGKey(1))
  i32 = jax.ShapeDtypeStruct((1, batch, seq), jnp.int32)
  data = {"tokens": i32, "targets": i32, "attention_mask": i32, "positions": i32,
          "loss_mask": jax.ShapeDtypeStruct((1, batch, seq), jnp.float32)}
  train = jax.jit(functools.partial(
      sft_step, optimizer=optimizer, model_config=mc, lora_scale=lora_scale(cfg), lora_dropout=0.0,
      remat=remat, dtype=jnp.dtype(dtype), logits_chunk=logits_chunk, causal_prefix=True), donate_argnums=(0,))
  t0 = time.perf_counter()
  mem = train.lower(state, params, data).compile().memory_analysis()
  out = {"args": mem.argument_size_in_bytes, "outputs": mem.output_size_in_bytes,
         "aliased": mem.alias_size_in_bytes, "temp": mem.temp_size_in_bytes,
         "compile_s": time.perf_counter() - t0}
  out["peak_plan"] = out["args"] + out["outputs"] - out["aliased"] + out["temp"]
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--models", nargs="*", default=list(MEMORY_TARGET_GB))
  p.add_argument("--seq", type=int, default=1024)
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--remat", default="full")
  p.add_argument("--logits-chunk", type=int, default=256)
  p.add_argument("--quant", default="nf4", choices=("nf4", "none"))
  p.add_argument("--dtype", default="bfloat16", help="compute dtype (float32: no CPU bf16->f32 upcasts)")
  args = p.parse_args(argv)
  import jax
  for name in args.models:
    r = plan(name, args.seq, args.batch, args.remat, args.logits_chunk, args.quant, args.dtype)
    print(json.dumps({"model": name, "backend": jax.default_backend(), **vars(args), "models": None,
                      **{k: (round(v / 1e9, 3) if k != "compile_s" else round(v, 1)) for k, v in r.items()},
                      "unit": "GB (1e9 bytes)"}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
