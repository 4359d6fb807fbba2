"""One full-parameter GRPO step (rollout + update) at the Qwen2.5-1.5B shape: fineflax vs tunix's
`GRPOLearner` on the same GPU, same settings (issue 31 target: fineflax >= 1.3x per step).

  python -m benchmarks.tunix_grpo --out DIR            # GPU: Qwen2.5-1.5B shape, ~5 min on one H100 / H200
  python -m benchmarks.tunix_grpo --smoke              # CPU: tiny Qwen2 shape, 2 prompts x 2 x 8 tokens
  python -m benchmarks.tunix_grpo --tunix-python VENV/bin/python   # tunix in its own interpreter
  python -m benchmarks.tunix_grpo --variants remat=full remat=none,micro=32 --out DIR
                                                       # fineflax twice (fresh processes), then tunix once
  bash benchmarks/run_gpu.sh tunix_grpo                # GPU machine: installs .whl3 (benchmarks/prep_whl3.sh)

The step is benchmarks/rl.py's (its workers, `_rl_fineflax.py` and `_rl_tunix.py`, with spec params="full"):
32 prompts (64 random token ids) x 8 samples, exactly 256 new tokens each (EOS off: tunix's EOS id is one
the model cannot sample, fineflax samples with eos_ids=()), temperature 1, the same pseudo-random rewards
of the decoded text, group advantages, one AdamW step (lr 1e-5, clip 1.0, bf16 parameters with f32
moments on both sides) of every parameter with the DAPO token-mean clipped loss (eps 0.2 / 0.28), no KL
(beta 0, so neither side keeps a reference model); random bf16 weights of the shape
(`fineflax.models.hub_shapes` "Qwen/Qwen2.5-1.5B": q/k/v biases, tied embeddings; tunix's Qwen2 model
with the same fields, checked against its own `ModelConfig.qwen2p5_1p5b()`).
fineflax's update (options, or one `--variants` spec per fineflax case: comma-separated KEY=VALUE of VARIANT_KEYS):
  --remat {full,none,dots}          model.remat (default full, its RL default)
  --micro-batch-size ROWS           config.rl.micro_batch_size: the update in micro-batches of ROWS rows, gradients
                                    accumulated (0 = all 256 rows in one update); what remat=none needs at this
                                    size (without remat one row keeps ~0.8 GB of activations: 32 rows fit an H100)
  --micro-batch-tokens T            config.rl.micro_batch_tokens: packed micro-batches instead (attention over
                                    a packed row is T x T: slower than row micro-batches here)
  --old-logp {auto,recompute}       config.rl.old_logp (default auto: one optimizer step per batch, so the step
                                    reads its own logp as old_logp, as tunix does; recompute = one more forward)
  --decode-impl {auto,scan,unrolled}  config.rl.decode_impl of the sampler (default auto = unrolled on GPUs, what
                                    this benchmark always used; the RL job's config default is scan)
  attention=gather|pallas|paged_decode (--variants only)  the engine's paged decode attention (default auto: the
                                    environment's FINEFLAX_PAGED_ATTENTION, else paged_decode on GPUs)
Remat: fineflax `model.remat` as above; tunix `RematConfig`
--tunix-remat (default NONE: its sampler shares the trained model, and 0.1.7's decode loop fails under
nnx.remat, with BLOCK and DECODER alike: flax TraceContextError "Cannot mutate Param from a different trace
level", checked on CPU; so tunix keeps every activation, which favours its speed) with training micro-batches of
--micro rows (default 16). tunix's learner skips the old-log-prob pass when num_iterations = 1, and so does
fineflax's with rl.old_logp=auto (`fineflax.rl.update.reuses_current_logp`): both as shipped.
Phases: rollout = generation + decode + rewards + advantages; update = the rest of the step (fineflax:
batch, old log-probs, the jitted step; tunix: its train step over micro-batches and the weight sync,
a no-op when actor and rollout share the model). Fastest of --steps timed steps after --warmup.
Results: DIR/tunix_grpo.json and .md after every case, RESULTS.md section "tunix_grpo" (not with --smoke).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import sys

from benchmarks import rl
from benchmarks._results import write_section

TARGET = 1.3  # tunix step seconds / fineflax step seconds (issue 31)
HUB_MODEL = "Qwen/Qwen2.5-1.5B"
TUNIX_PRESET = "qwen2p5_1p5b"  # tunix.models.qwen2.model.ModelConfig's classmethod of the same model
TINY_QWEN2 = dict(vocab=512, hidden=64, inter=128, layers=2, heads=4, kv_heads=2, head_dim=16,
                  rope_theta=1000000.0, norm_eps=1e-6, arch="qwen2")


def qwen2_shape(hub_name: str = HUB_MODEL) -> dict:
  """benchmarks' shape dict (sft.SHAPES keys + arch, norm_eps) of a Qwen2 hub model's config fields."""
  from fineflax.models.hub_shapes import hub_config
  h = hub_config(hub_name)
  if h is None or h.get("model_type") != "qwen2" or not h.get("tie_word_embeddings"):
    raise ValueError(f"{hub_name}: not a Qwen2 model with tied embeddings in fineflax.models.hub_shapes")
  return dict(vocab=h["vocab_size"], hidden=h["hidden_size"], inter=h["intermediate_size"],
              layers=h["num_hidden_layers"], heads=h["num_attention_heads"], kv_heads=h["num_key_value_heads"],
              head_dim=h["hidden_size"] // h["num_attention_heads"], rope_theta=h["rope_theta"],
              norm_eps=h["rms_norm_eps"], arch="qwen2")


# --variants keys -> (fineflax spec key, parser): the fineflax update settings one case may change
VARIANT_KEYS = {"remat": ("remat", str), "micro": ("micro_batch_size", int), "micro_tokens": ("micro_batch_tokens", int),
                "old_logp": ("old_logp", str), "decode": ("decode_impl", str), "attention": ("paged_attention", str)}
CHOICES = {"remat": ("none", "full", "dots"), "old_logp": ("auto", "recompute"), "decode": ("auto", "scan", "unrolled"),
           "attention": ("auto", "gather", "pallas", "paged_decode")}


def parse_variant(text: str) -> dict:
  """{spec key: value} of one --variants spec "remat=none,micro=32" (keys of VARIANT_KEYS); a bad one is an
  argparse error naming it."""
  out = {}
  for item in filter(None, text.split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in VARIANT_KEYS:
      raise argparse.ArgumentTypeError(f"--variants {text!r}: {item!r} is not KEY=VALUE with KEY one of "
                                       f"{', '.join(VARIANT_KEYS)}")
    if value not in CHOICES.get(key, (value,)):
      raise argparse.ArgumentTypeError(f"--variants {text!r}: {key}={value!r}; choose one of {CHOICES[key]}")
    name, parse = VARIANT_KEYS[key]
    try:
      out[name] = parse(value)
    except ValueError:
      raise argparse.ArgumentTypeError(f"--variants {text!r}: {key}={value!r} is not an integer") from None
  return out


def cases(args) -> list[dict]:
  """fineflax's case(s) then tunix's, one shape, full parameters: one fineflax case of the options, or one
  per --variants spec (the options with the spec's keys replaced, labelled by the spec)."""
  model, shape = ("tiny-qwen2", TINY_QWEN2) if args.smoke else ("Qwen2.5-1.5B", qwen2_shape())
  base = dict(model=model, shape=shape, params="full", tunix_preset=None if args.smoke else TUNIX_PRESET, prompts=args.prompts or (2 if args.smoke else 32),
              group=args.group or (2 if args.smoke else 8), prompt_len=args.prompt_len or (8 if args.smoke else 64),
              new_tokens=args.new_tokens or (8 if args.smoke else 256), warmup=args.warmup, steps=args.steps,
              agg_mode="token-mean", remat=args.remat, logits_chunk=16 if args.smoke else 32,
              trl_micro=2 if args.smoke else args.micro, tunix_remat=args.tunix_remat,
              micro_batch_size=args.micro_batch_size, micro_batch_tokens=args.micro_batch_tokens,
              old_logp=args.old_logp, decode_impl=args.decode_impl)
  frameworks = [f for f in ("fineflax", "tunix") if not args.frameworks or f in args.frameworks]
  variants = args.variants or [None]
  out = []
  for f in frameworks:
    for v in (variants if f == "fineflax" else [None]):
      out.append(dict(base, framework=f, **parse_variant(v), variant=v) if v else dict(base, framework=f))
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--smoke", action="store_true", help="tiny Qwen2 shape on any device; RESULTS.md untouched")
  p.add_argument("--steps", type=int, default=2, help="timed steps (default 2)")
  p.add_argument("--warmup", type=int, default=1, help="untimed steps, the first compiles (default 1)")
  p.add_argument("--prompts", type=int, help="prompts a step (default 32; smoke 2)")
  p.add_argument("--group", type=int, help="samples a prompt (default 8; smoke 2)")
  p.add_argument("--prompt-len", type=int, help="prompt tokens (default 64; smoke 8)")
  p.add_argument("--new-tokens", type=int, help="response tokens, exactly (default 256; smoke 8)")
  p.add_argument("--remat", default="full", choices=("none", "full", "dots"), help="fineflax model.remat")
  p.add_argument("--micro-batch-size", type=int, default=0,
                 help="fineflax config.rl.micro_batch_size: update micro-batches of this many rows (0 = one update)")
  p.add_argument("--micro-batch-tokens", type=int, default=0,
                 help="fineflax config.rl.micro_batch_tokens: packed update micro-batches of this many tokens")
  p.add_argument("--old-logp", default="auto", choices=("auto", "recompute"), help="fineflax config.rl.old_logp")
  p.add_argument("--decode-impl", default="auto", choices=("auto", "scan", "unrolled"),
                 help="fineflax config.rl.decode_impl (auto: unrolled on GPUs)")
  p.add_argument("--variants", nargs="*", default=None, type=lambda v: (parse_variant(v), v)[1],
                 help="one fineflax case per spec, e.g. remat=full remat=none,micro=32 (keys: "
                      + ", ".join(VARIANT_KEYS) + "); each a fresh process, tunix once after them")
  p.add_argument("--micro", type=int, default=16,
                 help="tunix training micro-batch, rows (default 16: 32 rows without remat would need ~90 GB)")
  p.add_argument("--tunix-remat", default="NONE", choices=("NONE", "BLOCK", "DECODER"),
                 help="tunix RematConfig (its sampler shares the trained model; see the docstring)")
  p.add_argument("--tunix-python", default=None,
                 help="interpreter of the tunix case (a venv with google-tunix); default this one")
  p.add_argument("--frameworks", nargs="*", default=None, help="subset of fineflax, tunix")
  p.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
  p.add_argument("--budget", type=float, default=450.0, help="seconds for all cases (an 8-minute call)")
  p.add_argument("--section", default="tunix_grpo", help="RESULTS.md section (default tunix_grpo)")
  p.add_argument("--out", default=os.environ.get("OUT", str(pathlib.Path(__file__).with_name("out"))))
  args = p.parse_args(argv)
  command = "python -m benchmarks.tunix_grpo " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
  rows, md = rl.run_cases(cases(args), command=command.strip(), out_dir=pathlib.Path(args.out), smoke=args.smoke,
                          budget=args.budget, timeout=args.timeout, name="tunix_grpo",
                          python={"tunix": args.tunix_python}, targets={"tunix": TARGET},
                          title="GRPO step at the Qwen2.5-1.5B shape: fineflax vs tunix")
  print(md)
  if not args.smoke:
    write_section(args.section, md)
  print(f"[tunix_grpo] wrote {args.out}/tunix_grpo.json, .md" + ("" if args.smoke else f" and RESULTS.md "
        f"section {args.section!r}"), file=sys.stderr)
  return 0 if all("timed" in r for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
