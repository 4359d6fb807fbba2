"""The fineflax worker of benchmarks/sft.py: one case's `make_sft_fns` train step (jit) on random bf16 weights of
its shape (LoRA adapters or, with params "full", the whole model), timed; also the LoRA / AdamW recipe both sides
train with (benchmarks/_sft_torch.py takes it from here) and a case's `ModelConfig`.

jax is imported inside the functions: the worker imports it in its own process.
"""
from __future__ import annotations

import math
import time

from benchmarks import gpu

LORA_R, LORA_ALPHA, LR = 16, 32.0, 1e-4


def model_config(spec: dict):
  from fineflax.models import ModelConfig
  s, t = spec["shape"], spec["seq"]
  return ModelConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["inter"],
                     num_layers=s["layers"], num_heads=s["heads"], num_kv_heads=s["kv_heads"],
                     head_dim=s["head_dim"], rope_theta=s["rope_theta"], tie_word_embeddings=True,
                     max_position_embeddings=max(t, 2048), layer_loop=spec.get("layer_loop", "scan"))


def _lora_params(params, model_config, key):
  """LoRA pytree {name: {"a": [L,in,r], "b": [L,r,out]}} and its scale; fineflax.lora when present."""
  import jax
  import jax.numpy as jnp
  try:
    from fineflax import lora as lora_lib
    cfg = lora_lib.LoraConfig(r=LORA_R, alpha=LORA_ALPHA, dropout=0.0,
                              target_modules=("q", "k", "v", "o", "gate", "up", "down"), use_rslora=False)
    return lora_lib.init_lora(params, model_config, cfg, key), lora_lib.lora_scale(cfg), "fineflax.lora"
  except (ImportError, AttributeError):
    pass
  from fineflax.models import LINEAR_NAMES
  lora = {}
  for name, k in zip(LINEAR_NAMES, jax.random.split(key, len(LINEAR_NAMES))):
    n_layers, d_in, d_out = params["layers"][name]["kernel"].shape
    lora[name] = {"a": jax.random.normal(k, (n_layers, d_in, LORA_R), jnp.float32) / math.sqrt(d_in),
                  "b": jnp.zeros((n_layers, LORA_R, d_out), jnp.float32)}
  return lora, LORA_ALPHA / LORA_R, "benchmark (fineflax.lora missing)"


def fineflax_worker(spec: dict) -> dict:
  import types

  import jax
  import jax.numpy as jnp
  import numpy as np

  from fineflax.models import init_params
  from fineflax.models.layer_loop import resolve_layer_loop
  from fineflax.train.optim import make_optimizer
  from fineflax.train.sft_step import make_sft_fns
  from fineflax.train.state import init_state

  b, t = spec["batch"], spec["seq"]
  loop = resolve_layer_loop(spec.get("layer_loop", "scan"), spec["remat"])  # "auto" -> this backend's choice
  mc = model_config(dict(spec, layer_loop=loop))
  params = init_params(mc, jax.random.PRNGKey(0), dtype=jnp.bfloat16)
  full = spec.get("params", "lora") == "full"
  if full:  # train.params="full": the whole bf16 model is the trainable pytree, no base (trainable.py)
    lora, scale, lora_source, params = params, 0.0, "n/a (full parameters)", None
  else:
    lora, scale, lora_source = _lora_params(params, mc, jax.random.PRNGKey(1))
  opt_cfg = types.SimpleNamespace(learning_rate=LR, warmup_steps=0, num_steps=10_000, end_lr_ratio=1.0,
                                  weight_decay=0.0, b1=0.9, b2=0.999, grad_clip=1.0)
  optimizer = make_optimizer(opt_cfg, spec.get("moment_dtype", "float32"))
  train, _ = make_sft_fns(optimizer, donate=full, model_config=mc, lora_scale=scale, lora_dropout=0.0,
                          remat=spec["remat"], dtype=jnp.bfloat16, logits_chunk=spec["logits_chunk"],
                          causal_prefix=spec.get("causal_prefix", True), loss_head=spec.get("loss_head", "chunked"))
  state = init_state(lora, optimizer, seed=0)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, mc.vocab_size, size=(1, b, t + 1), dtype=np.int32)
  batch = {"tokens": tokens[..., :-1], "targets": tokens[..., 1:],
           "loss_mask": np.ones((1, b, t), np.float32), "attention_mask": np.ones((1, b, t), np.int32),
           "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (1, b, t)).copy(),
           "segment_ids": np.ones((1, b, t), np.int32)}  # ignored with causal_prefix (one sequence a row)
  batch = jax.device_put(batch)

  t0 = time.perf_counter()
  compiled = train.lower(state, params, batch).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  xla_bytes = None if mem is None else (mem.argument_size_in_bytes + mem.output_size_in_bytes
                                        - mem.alias_size_in_bytes + mem.temp_size_in_bytes)
  dt, loss = gpu.time_jax_steps(compiled, state, params, batch, warmup=spec["warmup"],
                                 steps=spec["steps"])
  n_trainable = sum(x.size for x in jax.tree.leaves(state["params"]))
  return {"trainable_params": int(n_trainable), "seconds": dt, "compile_s": compile_s, "loss": loss,
          "peak_bytes": gpu.jax_peak_bytes(),
          "xla_bytes": xla_bytes, "device": gpu.jax_device_name(), "lora_init": lora_source, "layer_loop": loop,
          "versions": {"jax": jax.__version__}}
