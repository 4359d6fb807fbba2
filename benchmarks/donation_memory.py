"""Full-parameter state donation: the compiled step's memory with and without donating the train state,
from XLA's `memory_analysis()` of the compiled programs (no run; on CPU `memory_stats()` is None).

  python -m benchmarks.donation_memory [--hidden 512] [--layers 4] [--vocab 8192] [--rows 4] [--seq 256]
                                       [--out benchmarks/out/donation_memory] [--no-results]

For each step (RL GRPO step `fineflax.rl.step.make_rl_fns`, SFT step `fineflax.train.sft_step.make_sft_fns`,
distill step `fineflax.train.distill_step.make_distill_fn`) on a random model of the given shape, full
parameters in bf16 with f32 AdamW moments (`config.train.params="full"`, master_dtype bfloat16):
  arguments  bytes of the inputs (state + batch [+ teacher])
  outputs    bytes of the outputs (new state + metrics)
  aliased    output bytes written into donated input buffers
  temp       XLA's scratch
  peak       arguments + outputs - aliased + temp: the live bytes of one step, as XLA plans it
Writes OUT/donation_memory.json and the RESULTS.md section "donation_memory" (labelled CPU, analysis-based).
"""
from __future__ import annotations

import argparse
import json
import os
import platform

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._results import markdown_table, write_section
from fineflax.io import atomic_write_text
from fineflax.models import ModelConfig, init_params
from fineflax.rl.batch import build_rl_batch
from fineflax.rl.step import make_rl_fns
from fineflax.train.distill_step import make_distill_fn
from fineflax.train.optim import with_f32_state
from fineflax.train.sft_step import make_sft_fns
from fineflax.train.state import init_state

MiB = 2.0 ** 20


def model_config(a) -> ModelConfig:
  heads = max(1, a.hidden // 64)
  return ModelConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.hidden * 3, num_layers=a.layers,
                     num_heads=heads, num_kv_heads=max(1, heads // 2), head_dim=64, eos_token_ids=(1,))


def rl_batch(a) -> dict:
  rng = np.random.RandomState(0)
  half = a.seq // 2
  batch = build_rl_batch([list(rng.randint(2, a.vocab, half)) for _ in range(a.rows)],
                         [list(rng.randint(2, a.vocab, half)) for _ in range(a.rows)],
                         [[1.0] * half for _ in range(a.rows)], pad_id=0, completion_width=half)
  batch["advantages"] = rng.randn(a.rows).astype(np.float32)
  batch["old_logp"] = np.full(batch["mask"].shape, -1.0, np.float32)
  return {k: jnp.asarray(v) for k, v in batch.items()}


def sft_batch(batch) -> dict:
  tokens = np.asarray(batch["tokens"])
  targets = np.concatenate([tokens[:, 1:], np.zeros_like(tokens[:, :1])], 1)
  return {k: jnp.asarray(v)[None] for k, v in dict(tokens=tokens, targets=targets, loss_mask=np.ones(tokens.shape,
                                                   np.float32), attention_mask=batch["attention_mask"],
                                                   positions=batch["positions"]).items()}


def analyse(fn, *args) -> dict:
  m = fn.lower(*args).compile().memory_analysis()
  out = {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
         "aliased": m.alias_size_in_bytes, "temp": m.temp_size_in_bytes}
  out["peak"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temp"]
  return out


def steps(cfg, opt, batch):
  """name -> (make(donate) -> the jitted step, its arguments but the state)."""
  fwd = dict(model_config=cfg, lora_scale=1.0, dtype=jnp.bfloat16)
  loss = dict(epsilon_low=0.2, epsilon_high=0.2, beta=0.0, entropy_coef=0.0, agg_mode="token-mean")
  teacher = init_params(cfg, jax.random.PRNGKey(1), dtype=jnp.bfloat16)
  return {
      "RL (GRPO)": (lambda d: make_rl_fns(opt, objective="grpo", loss_kwargs=loss, fwd_kwargs=fwd, donate=d)[0],
                    (None, batch)),
      "SFT": (lambda d: make_sft_fns(opt, donate=d, **dict(fwd, lora_scale=1.0))[0], (None, sft_batch(batch))),
      "distill": (lambda d: make_distill_fn(opt, model_config=cfg, donate=d, lora_scale=1.0, dtype=jnp.bfloat16),
                  (None, teacher, None, {k: batch[k] for k in ("tokens", "attention_mask", "positions", "mask")})),
  }


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--hidden", type=int, default=512)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--vocab", type=int, default=8192)
  p.add_argument("--rows", type=int, default=4)
  p.add_argument("--seq", type=int, default=256)
  p.add_argument("--out", default="benchmarks/out/donation_memory")
  p.add_argument("--no-results", action="store_true", help="do not write benchmarks/RESULTS.md")
  a = p.parse_args(argv)
  cfg = model_config(a)
  import optax
  opt = with_f32_state(optax.adamw(1e-5))
  params = init_params(cfg, jax.random.PRNGKey(0), dtype=jnp.bfloat16)
  state = init_state(params, opt, 0)
  batch = rl_batch(a)
  state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
  rows, record = [], {"device": jax.devices()[0].device_kind, "state_bytes": state_bytes, "steps": {}}
  for name, (make, args) in steps(cfg, opt, batch).items():
    kept, donated = analyse(make(False), state, *args), analyse(make(True), state, *args)
    record["steps"][name] = {"kept": kept, "donated": donated}
    rows.append([name, kept["peak"] / MiB, donated["peak"] / MiB, donated["aliased"] / MiB,
                 (donated["temp"] - kept["temp"]) / MiB, (kept["peak"] - donated["peak"]) / MiB,
                 (kept["peak"] - donated["peak"]) / state_bytes])
  header = ["step", "peak kept MiB", "peak donated MiB", "aliased MiB", "temp growth MiB", "saved MiB",
            "saved / state"]
  table = markdown_table(header, rows)
  print(table)
  os.makedirs(a.out, exist_ok=True)
  atomic_write_text(os.path.join(a.out, "donation_memory.json"), json.dumps(record, indent=1))
  if not a.no_results:
    n_params = sum(x.size for x in jax.tree.leaves(params))
    write_section("donation_memory", f"""## Full-parameter state donation: step memory (CPU, XLA memory_analysis)

`python -m benchmarks.donation_memory --hidden {a.hidden} --layers {a.layers} --vocab {a.vocab} --rows {a.rows} --seq {a.seq}`
on {platform.processor() or platform.machine()} (CPU; analysis-based: XLA's compiled-program
`memory_analysis()`, not a measured peak). A random model of {n_params / 1e6:.1f}M parameters, bf16 params +
f32 AdamW moments (train state {state_bytes / MiB:.1f} MiB), batch {a.rows} rows x {a.seq} tokens. Peak =
arguments + outputs - aliased + temp. "Donated": the step donates the train state (full mode,
`Trainable.donate`), so XLA writes the new params and moments into the old buffers (aliased bytes).

{table}

The saving is less than the whole state because XLA's buffer assignment gives the donated program more
scratch ("temp growth"): on {jax.devices()[0].platform.upper()} it keeps part of the old state's values
beside the in-place outputs (the same holds for plain f32 AdamW without the bf16 wrapper). The GPU compiler
assigns buffers differently: run the same command on the GPU for its figure.
""")


if __name__ == "__main__":
  main()
