"""Does the cuDNN attention path honour segment ids? Packed-row logits, cuDNN vs XLA, within bf16 noise.

  python -m benchmarks.check_cudnn_segments [--model smollm2-135m-instruct|PATH.gguf|HF_FOLDER|random]
                                            [--batch 4] [--max_length 256] [--out DIR]

A packed batch of the bundled arithmetic chats is built by the SFT batch iterator (packing=True: several
conversations per row, segment ids 1, 2, ..., padding 0) and run through `fineflax.models.forward` three
ways (the attention kernel is picked per trace from FINEFLAX_ATTENTION, see `decoder.attention_impl`):

  xla_f32     FINEFLAX_ATTENTION=xla,   float32 compute   the reference
  xla_bf16    FINEFLAX_ATTENTION=xla,   bfloat16 compute  the bf16 noise floor: err(xla_bf16)
  cudnn_bf16  FINEFLAX_ATTENTION=cudnn, bfloat16 compute  (GPU only; skipped with a message on CPU)

err(x) = max |logits_x - logits_xla_f32| over real tokens (attention_mask = 1); also reported relative to
max |logits_xla_f32|, and max |cudnn_bf16 - xla_bf16|. Leak check: the tokens of every row's first
segment are replaced by other ids; the logits of the row's other segments must not move (max change
leak(x) <= 0.25 * err(xla_bf16) + 1e-3), since no token may attend outside its segment.

PASS: err(cudnn_bf16) <= 1.5 * err(xla_bf16) + 1e-2 (cuDNN is no further from the f32 reference than XLA
in bf16, up to a margin) and the leak checks pass. Exit code 0 on PASS (or when cuDNN is skipped on a
non-GPU backend and the XLA checks pass), 1 on FAIL. A cuDNN path that ignored segment ids would let
later segments attend to earlier ones: their logits would differ by O(1), far above bf16 noise, and the
leak check would move them. `--out DIR` writes DIR/check_cudnn_segments.json; the table goes to the
`check_cudnn_segments` section of benchmarks/RESULTS.md (unless --no_results).
"""
from __future__ import annotations

import argparse
import json
import os
import sys


import numpy as np


def packed_batch(tokenizer, batch: int, max_length: int) -> dict:
  from fineflax.data import Mixture, load_source, make_batch_iterator
  src = load_source("sample:arithmetic_messages.jsonl")
  it = make_batch_iterator(Mixture([(src, 1.0)], seed=0), tokenizer, batch_size=batch,
                           max_length=max_length, packing=True)
  return next(it)


def load_model(spec: str, vocab: int):
  """(params f32, config, description): a checkpoint, or random weights of SmolLM2-135M's shape."""
  import jax
  from fineflax.models import ModelConfig, init_params, load
  if spec != "random":
    try:
      params, cfg, _ = load(spec, with_tokenizer=False)
      return params, cfg, spec
    except Exception as e:  # noqa: BLE001 - fall back, and say so
      print(f"note: cannot load {spec!r} ({type(e).__name__}: {e}); using random weights", flush=True)
  cfg = ModelConfig(vocab_size=vocab, hidden_size=576, intermediate_size=1536, num_layers=6, num_heads=9,
                    num_kv_heads=3, head_dim=64, rope_theta=100000.0, tie_word_embeddings=True)
  return init_params(cfg, jax.random.PRNGKey(0), std=0.1), cfg, "random (SmolLM2-135M shape, 6 layers)"


def logits(params, cfg, batch: dict, impl: str, dtype) -> np.ndarray:
  """forward() logits [B, T, V] (f32) with the attention kernel `impl` (traced fresh under that env)."""
  import jax
  from fineflax.models import forward
  os.environ["FINEFLAX_ATTENTION"] = impl
  try:
    fn = jax.jit(lambda p, t, pos, am, seg: forward(p, cfg, t, positions=pos, attention_mask=am,
                                                     segment_ids=seg, dtype=dtype))
    out = fn(params, batch["tokens"], batch["positions"], batch["attention_mask"], batch["segment_ids"])
    return np.asarray(jax.device_get(out), np.float32)
  finally:
    os.environ.pop("FINEFLAX_ATTENTION", None)


def perturb_first_segments(batch: dict, vocab: int) -> tuple[dict, np.ndarray]:
  """(batch with each row's segment-1 tokens shifted to other ids, mask of real tokens in segments >= 2)."""
  out = dict(batch)
  first = batch["segment_ids"] == 1
  out["tokens"] = np.where(first, (batch["tokens"] + 1 + np.arange(batch["tokens"].shape[1]) % 97) % vocab,
                           batch["tokens"]).astype(np.int32)
  return out, batch["segment_ids"] >= 2


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", default="smollm2-135m-instruct")
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--max_length", type=int, default=256)
  ap.add_argument("--out", default=None)
  ap.add_argument("--no_results", action="store_true", help="leave benchmarks/RESULTS.md untouched")
  args = ap.parse_args(argv)

  import jax
  import jax.numpy as jnp
  from fineflax.models import load_tokenizer
  backend = jax.default_backend()
  from benchmarks.gpu import device_name
  device = device_name() if backend == "gpu" else f"CPU, {len(os.sched_getaffinity(0))} cores"
  tok = load_tokenizer("smollm2-135m-instruct")
  params, cfg, model = load_model(args.model, len(tok))
  batch = packed_batch(tok, args.batch, args.max_length)
  real = batch["attention_mask"].astype(bool)
  segs = int(batch["segment_ids"].max(axis=1).min())
  print(f"device {device}; model {model}; batch {args.batch} x {args.max_length}, "
        f"{int((batch['segment_ids'].max(axis=1)).sum())} segments (>= {segs} a row), "
        f"{int(real.sum())} real tokens", flush=True)
  if segs < 2:
    print("FAIL: the packed batch has a row with fewer than 2 segments; nothing to check")
    return 1

  perturbed, later = perturb_first_segments(batch, cfg.vocab_size)
  ref = logits(params, cfg, batch, "xla", jnp.float32)
  scale = float(np.abs(ref[real]).max())
  impls = [("xla_f32", "xla", jnp.float32), ("xla_bf16", "xla", jnp.bfloat16)]
  skipped = None
  if backend == "gpu":
    impls.append(("cudnn_bf16", "cudnn", jnp.bfloat16))
  else:
    skipped = f"cuDNN attention needs a GPU; backend is {backend}: cudnn_bf16 skipped"
  results = {}
  for name, impl, dtype in impls:
    try:
      a = ref if name == "xla_f32" else logits(params, cfg, batch, impl, dtype)
      b = logits(params, cfg, perturbed, impl, dtype)
    except Exception as e:  # noqa: BLE001 - a kernel that cannot run is a FAIL, reported
      results[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
      continue
    err = float(np.abs(a - ref)[real].max())
    results[name] = {"err_abs": err, "err_rel": err / scale,
                     "leak_abs": float(np.abs(b - a)[later].max()), "logits": a}
  noise = results["xla_bf16"].get("err_abs", float("nan"))
  leak_tol = 0.25 * noise + 1e-3
  checks = {}
  for name, r in results.items():
    if "error" in r:
      checks[name] = False
      continue
    checks[name] = r["leak_abs"] <= leak_tol
    if name == "cudnn_bf16":
      r["vs_xla_bf16_abs"] = float(np.abs(r["logits"] - results["xla_bf16"]["logits"])[real].max())
      checks[name] = checks[name] and r["err_abs"] <= 1.5 * noise + 1e-2
  print(f"{'path':<11} {'max|d| vs f32':>14} {'relative':>10} {'leak':>10}  (max |logits| {scale:.3g}; "
        f"leak tolerance {leak_tol:.3g})")
  for name, r in results.items():
    if "error" in r:
      print(f"{name:<11} ERROR {r['error']}")
      continue
    extra = f"  max|d| vs xla_bf16 {r['vs_xla_bf16_abs']:.4g}" if "vs_xla_bf16_abs" in r else ""
    print(f"{name:<11} {r['err_abs']:>14.4g} {r['err_rel']:>10.3g} {r['leak_abs']:>10.3g}  "
          f"{'ok' if checks[name] else 'FAIL'}{extra}")
  if skipped:
    print(f"SKIP: {skipped}")
  ok = all(checks.values())
  verdict = "PASS" if ok and not skipped else ("PASS (XLA only)" if ok else "FAIL")
  print(verdict)
  if not args.no_results:
    from benchmarks._results import markdown_table, write_section
    rows = [[n, "error: " + r["error"][:80], "", "", ""] if "error" in r else
            [n, r["err_abs"], r["err_rel"], r["leak_abs"], "ok" if checks[n] else "FAIL"]
            for n, r in results.items()]
    cmd = "python -m benchmarks.check_cudnn_segments" + (f" --model {args.model}"
                                                         if args.model != "smollm2-135m-instruct" else "")
    write_section("check_cudnn_segments", "\n\n".join([
        "## cuDNN attention honours segment ids (packed rows)",
        f"Packed batch {args.batch} x {args.max_length} of the bundled arithmetic chats "
        f"({int(batch['segment_ids'].max(axis=1).sum())} segments), model {model}. max|d| = max abs logit "
        f"difference from the XLA f32 path over real tokens (relative: / max|logits| = {scale:.3g}); leak = "
        f"max change of segments >= 2 when segment 1's tokens are replaced (tolerance {leak_tol:.3g}).",
        markdown_table(["path", "max abs diff vs xla_f32", "relative", "leak", "check"], rows),
        f"Verdict: **{verdict}**" + (f" ({skipped})" if skipped else "") + ".",
        f"Device: {device}. Command: `{cmd}`"]))
  if args.out:
    from fineflax.io import atomic_write_text
    summary = {"device": device, "model": model, "batch": args.batch, "max_length": args.max_length,
               "verdict": verdict, "skipped": skipped, "max_abs_logit": scale, "leak_tolerance": leak_tol,
               "paths": {n: {k: v for k, v in r.items() if k != "logits"} for n, r in results.items()}}
    os.makedirs(args.out, exist_ok=True)
    atomic_write_text(os.path.join(args.out, "check_cudnn_segments.json"), json.dumps(summary, indent=2))
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
