"""The mechanism behind `model.layer_loop = "unrolled"`: data-movement ops in the compiled SFT step, scan vs unrolled.

  python -m benchmarks.layer_loop_hlo                 # Llama-3.2-1B shape, 4 x 1024, bf16 and NF4, this backend
  python -m benchmarks.layer_loop_hlo --smoke         # tiny shape (seconds)
  python -m benchmarks.layer_loop_hlo --section layer_loop_hlo_cpu   # also writes that RESULTS.md section

Builds the training step as benchmarks/sft.py does (`make_sft_fns`, LoRA r=16 on all linears, logits chunk 256,
one right-padded sequence a row) from abstract arrays (`jax.eval_shape`: no weights are allocated), compiles it
for the default backend and counts instructions of the optimised HLO text (fusion bodies included; each op of
the scan's while body runs L times, each op of the unrolled program once):

  dus         dynamic-update-slice: under the scan, writing each layer's saved activations / gradients into
              [L, ...] stacks; `dus_layers` leaves out the chunked loss head's own scan (`loss_head` scope)
  ds          dynamic-slice: reading layer i's slice of a stack (weights, residuals)
  slice       static slices (the unrolled loop's per-layer weights: a copy unless XLA fuses it into its user)
  copy        copy instructions (layout changes, buffers the scan carries)
  while       while loops (the layer scan forward and backward, the loss head's chunk scan)
Prints a table (and writes DIR/layer_loop_hlo.json with --out).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import sys
import time


from benchmarks._results import markdown_table, write_section


def count_ops(hlo_text: str) -> dict:
  """{dus, dus_layers, ds, slice, copy, while}: instruction counts of an HLO module's text (see the module docstring)."""
  lines = hlo_text.splitlines()
  has = lambda line, op: re.search(rf"\s{op}\(", line.split(", metadata=")[0]) is not None
  return {"dus": sum(has(ln, "dynamic-update-slice") for ln in lines),
          "dus_layers": sum(has(ln, "dynamic-update-slice") and "loss_head" not in ln for ln in lines),
          "ds": sum(has(ln, "dynamic-slice") for ln in lines),
          "slice": sum(has(ln, "slice") for ln in lines),
          "copy": sum(has(ln, "copy") for ln in lines),
          "while": sum(has(ln, "while") for ln in lines)}


def compiled_text(mc, quant: str, remat: str, b: int, t: int, chunk: int) -> tuple[str, float]:
  import types

  import jax
  import jax.numpy as jnp
  import numpy as np

  from benchmarks._sft_fineflax import _lora_params
  from fineflax.models import init_params
  from fineflax.models.quantize import quantize_params
  from fineflax.train.optim import make_optimizer
  from fineflax.train.sft_step import make_sft_fns
  from fineflax.train.state import init_state

  def build():
    params = init_params(mc, jax.random.PRNGKey(0), dtype=jnp.bfloat16)
    lora, _, _ = _lora_params(params, mc, jax.random.PRNGKey(1))
    return (quantize_params(params) if quant == "nf4" else params), lora
  params, lora = jax.eval_shape(build)
  opt = make_optimizer(types.SimpleNamespace(learning_rate=1e-4, warmup_steps=0, num_steps=10_000,
                                             end_lr_ratio=1.0, weight_decay=0.0, b1=0.9, b2=0.999, grad_clip=1.0))
  train, _ = make_sft_fns(opt, model_config=mc, lora_scale=2.0, lora_dropout=0.0, remat=remat,
                          dtype=jnp.bfloat16, logits_chunk=chunk, causal_prefix=True)
  state = jax.eval_shape(lambda lo: init_state(lo, opt, seed=0), lora)
  arr = lambda dt: jax.ShapeDtypeStruct((1, b, t), dt)
  batch = {"tokens": arr(np.int32), "targets": arr(np.int32), "loss_mask": arr(np.float32),
           "attention_mask": arr(np.int32), "positions": arr(np.int32)}
  t0 = time.perf_counter()
  text = train.lower(state, params, batch).compile().as_text()
  return text, time.perf_counter() - t0


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="Llama-3.2-1B", help="a shape of benchmarks/sft.py")
  p.add_argument("--smoke", action="store_true", help="tiny shape")
  p.add_argument("--quant", nargs="*", default=["none", "nf4"], choices=("none", "nf4"))
  p.add_argument("--remat", nargs="*", default=["none", "full"], choices=("none", "dots", "full"))
  p.add_argument("--out", default=None, help="folder for layer_loop_hlo.json")
  p.add_argument("--section", default=None, help="also write this RESULTS.md section")
  args = p.parse_args(argv)
  import jax

  from benchmarks.sft import SHAPES, SMOKE_SHAPES, model_config
  shape, b = SMOKE_SHAPES["tiny"] if args.smoke else SHAPES[args.model]
  t, chunk = (64, 16) if args.smoke else (1024, 256)
  mc = model_config({"shape": shape, "seq": t})
  rows, records = [], []
  for quant in args.quant:
    for remat in args.remat:
      for loop in ("scan", "unrolled"):
        text, secs = compiled_text(dataclasses.replace(mc, layer_loop=loop), quant, remat, b, t, chunk)
        c = count_ops(text)
        records.append(dict(c, quant=quant, remat=remat, layer_loop=loop, compile_s=secs))
        rows.append([quant, remat, loop, c["dus"], c["dus_layers"], c["ds"], c["slice"], c["copy"], c["while"],
                     round(secs, 1)])
        print(f"[hlo] {quant} remat={remat} {loop}: {c} ({secs:.0f}s)", file=sys.stderr, flush=True)
  name = "tiny" if args.smoke else args.model
  command = "python -m benchmarks.layer_loop_hlo " + " ".join(argv if argv is not None else sys.argv[1:])
  md = "\n".join([f"## Layer scan vs unrolled layer loop: HLO op counts ({args.section or 'layer_loop_hlo'})", "",
                  f"Command: `{command.strip()}`. HLO op counts of the compiled SFT step, {name} shape, {b} x {t}, backend "
                  f"{jax.default_backend()} ({jax.devices()[0].device_kind}), jax {jax.__version__}:", "",
                  markdown_table(["weights", "remat", "layer loop", "dynamic-update-slice", "of which outside loss head",
                                  "dynamic-slice", "slice", "copy", "while", "compile s"], rows), "",
                  "Counts are instructions of the optimised HLO (fusion bodies included): under the scan each "
                  "op of the while bodies runs once per layer. The two dynamic-update-slices left in the "
                  "unrolled step are the chunked loss head's (`loss_head`)."])
  print(md)
  if args.section:
    write_section(args.section, md)
  if args.out:
    from fineflax.io import atomic_write_text
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "layer_loop_hlo.json", json.dumps({"model": name, "rows": records}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
