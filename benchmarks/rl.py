"""One GRPO step (rollout + update) of fineflax vs TRL `GRPOTrainer` vs tunix `GRPOLearner`, same GPU, same run.

  python -m benchmarks.rl --out DIR       # GPU: SmolLM2-135M and Llama-3.2-1B shapes (< 6 min on an H100)
  python -m benchmarks.rl --smoke         # CPU check: tiny shape, 2 prompts x 2 samples, 8 tokens; prints only
  bash benchmarks/run_gpu.sh rl           # GPU machine without internet: carry .whl and .whl3 (TRL, datasets,
                                          # tunix, qwix and their missing dependencies), installs them, runs this

The step: 32 prompts (64 random token ids) x 8 samples, exactly 256 new tokens each (EOS off), temperature 1,
random rewards of the decoded text (benchmarks/_rl_common.py), group advantages, then one optimizer update
of LoRA r=16 alpha=32 on q,k,v,o,gate,up,down (AdamW, clip 1.0) with the DAPO token-mean clipped loss
(eps 0.2 / 0.28), no KL (beta 0). Random bf16 weights of the model's shape (tied embeddings).
Workers: benchmarks/_rl_fineflax.py (the RL job's own functions), _rl_trl.py, _rl_tunix.py; each runs in a
fresh subprocess with a timeout (JAX without preallocation), fineflax and TRL first, tunix last.
Times: the fastest of `steps` timed steps after `warmup` untimed ones (the first compiles / warms up);
rl.json also has their mean and every step.
Results go to DIR/rl.json and DIR/rl.md after every case, and to RESULTS.md section "rl" at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import sys
import time
import traceback


from benchmarks import gpu
from benchmarks._results import markdown_table, write_section
from benchmarks.sft import SHAPES, SMOKE_SHAPES
from fineflax.io import atomic_write_text

FRAMEWORKS = ("fineflax", "trl", "tunix")
TARGETS = {"trl": 3.0, "tunix": 1.0}  # fineflax step speed over theirs (issue 17)


def cases(args) -> list[dict]:
  """One dict per (model, framework); fineflax and TRL for every model first, tunix last."""
  shapes = {k: v[0] for k, v in (SMOKE_SHAPES if args.smoke else SHAPES).items()}
  base = dict(prompts=2 if args.smoke else 32, group=2 if args.smoke else 8, prompt_len=8 if args.smoke else 64,
              new_tokens=8 if args.smoke else 256, warmup=args.warmup, steps=args.steps, agg_mode="token-mean",
              trl_loss="dapo", remat="full", logits_chunk=16 if args.smoke else 32,
              trl_micro=2 if args.smoke else args.trl_micro, tunix_remat=args.tunix_remat, quant=args.quant)
  out = []
  for group in (("fineflax", "trl"), ("tunix",)):
    for model, shape in shapes.items():
      if args.models and model not in args.models:
        continue
      out += [dict(base, model=model, shape=shape, framework=f) for f in group
              if not args.frameworks or f in args.frameworks]
  return out


def worker(spec: dict) -> dict:
  """Runs one case in this process; an exception becomes {"error": ...} (import failures "not run: ...")."""
  import importlib
  try:
    mod = importlib.import_module(f"benchmarks._rl_{spec['framework']}")
    return mod.run(spec)
  except ImportError as e:
    traceback.print_exc()
    return {"error": f"not run: {type(e).__name__}: {e}"}
  except Exception as e:  # noqa: BLE001 - the table says why a case failed
    traceback.print_exc()
    return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def gib(x):
  return "n/a" if x is None else round(x / gpu.GIB, 2)


def _fmt(x, nd=2):
  return "" if x is None else round(x, nd)


def report(rows: list[dict], device: str, command: str, smoke: bool, targets: dict = TARGETS,
           title: str = "GRPO step: fineflax vs TRL vs tunix") -> str:
  """The markdown section of `rows` (one `params` kind); `targets`: their step time over fineflax's."""
  header = ["model", "framework", "step s", "rollout s (generate)", "update s", "gen tokens/s",
            "first step s (rollout / update)", "setup s", "peak GiB", "fineflax speed-up"]
  table, summary = [], []
  for model in dict.fromkeys(r["model"] for r in rows):
    mine = [r for r in rows if r["model"] == model]
    best = fastest_fineflax(mine)
    ff = best["timed"]["step"] if best else None
    for r in mine:
      f, label = r["framework"], case_label(r)
      if "error" in r:
        table.append([model, label, r["error"][:160].replace("|", "/")] + [""] * 7)
        continue
      t, first = r["timed"], r["first"]
      gen_tokens = r["prompts"] * r["group"] * r["new_tokens"]
      speed = (f"{ff / t['step']:.2f}x" if f == "fineflax" else f"**{t['step'] / ff:.2f}x**") if ff else "n/a"
      table.append([model, label, _fmt(t["step"]), f"{_fmt(t['rollout'])} ({_fmt(t.get('generate'))})",
                    _fmt(t["update"]), round(gen_tokens / t["generate"]) if t.get("generate") else "n/a",
                    f"{_fmt(first.get('step'), 1)} ({_fmt(first.get('rollout'), 1)} / {_fmt(first.get('update'), 1)})",
                    _fmt(r.get("setup_s"), 1), gib(r.get("peak_bytes")), speed])
      if f == "fineflax" or not ff:
        continue
      for v in [best] + [x for x in mine if x is not best and x["framework"] == "fineflax" and "timed" in x]:
        tv = v["timed"]
        ratio = t["step"] / tv["step"]
        summary.append(f"- {model}: {case_label(v)} {tv['step']:.2f} s vs {f} {t['step']:.2f} s per step = "
                       f"**{ratio:.2f}x** (target >= {targets[f]:g}x: {'met' if ratio >= targets[f] else 'missed'}); "
                       f"rollout {t['rollout'] / tv['rollout']:.2f}x, update {t['update'] / tv['update']:.2f}x")
  versions, settings = {}, []
  for r in rows:
    versions.update(r.get("versions", {}))
    if "settings" in r and (case_label(r), r["settings"]) not in [s[:2] for s in settings]:
      settings.append((case_label(r), r["settings"], r["model"]))
  r0 = rows[0]
  full = r0.get("params", "lora") == "full"
  title = (f"## {title} (" + ("full parameters" if full else "LoRA r=16") + ", one update per rollout)"
           + (" — SMOKE (tiny shape, CPU)" if smoke else ""))
  trained = ("every parameter (bf16 parameters, f32 AdamW moments)" if full
             else "LoRA r=16 alpha=32 on all 7 linears")
  counts = {r["framework"]: r["trainable_params"] for r in rows if r.get("trainable_params")}
  lines = [title, "", f"Device: {device}. Command: `{command}`.",
           "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ".", "",
           f"One step = {r0['prompts']} prompts ({r0['prompt_len']} random tokens) x {r0['group']} samples x exactly "
           f"{r0['new_tokens']} new tokens (temperature 1, EOS off), random rewards of the decoded text, group "
           f"advantages, one AdamW update (clip 1.0) of {trained} with the DAPO token-mean "
           "clipped loss (eps 0.2/0.28), no KL; random bf16 weights of the model's shape"
           + (" (trainable parameters: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()) + ")"
              if full and counts else "") + ". "
           f"Fastest of {r0['steps']} timed steps after {r0['warmup']} warm-up step (its times, which include "
           "compilation, are the 'first step' column); each case in a fresh process. rollout = generation + decode + "
           "rewards + advantages (generate = the sampler alone); update = the rest of the step (fineflax: batch, old "
           "log-probs, jitted update; TRL: micro-batch forward/backward + optimizer; tunix: its train step over "
           "micro-batches + weight sync). gen tokens/s = rows x new tokens / generate s. fineflax speed-up = their "
           "step time / the fastest fineflax case's (on a fineflax row: the fastest's over its own).", "",
           markdown_table(header, table), "", "Settings:"]
  lines += [f"- {f} ({m}): {s}" for f, s, m in settings]
  return "\n".join(lines + [""] + summary)


def case_label(row: dict) -> str:
  """The framework, with its variant when a benchmark runs several of one framework ("fineflax (remat=none)")."""
  return f"{row['framework']} ({row['variant']})" if row.get("variant") else row["framework"]


def fastest_fineflax(rows: list[dict]) -> dict | None:
  """The timed fineflax row of least step time (the reference of the speed-ups), None if none ran."""
  timed = [r for r in rows if r["framework"] == "fineflax" and "timed" in r]
  return min(timed, key=lambda r: r["timed"]["step"]) if timed else None


def write_outputs(out_dir: pathlib.Path, rows, device, command, smoke, t_all, name: str = "rl",
                  **report_kw) -> str:
  md = report(rows, device, command, smoke, **report_kw)
  out_dir.mkdir(parents=True, exist_ok=True)
  for file, text in ((f"{name}.json", json.dumps({"device": device, "command": command, "smoke": smoke,
                                                   "wall_s": time.perf_counter() - t_all, "rows": rows}, indent=1)),
                     (f"{name}.md", md)):
    atomic_write_text(out_dir / file, text)
  return md


def run_cases(cases: list[dict], *, command: str, out_dir: pathlib.Path, smoke: bool, budget: float,
              timeout: float, name: str = "rl", python: dict | None = None, **report_kw) -> tuple[list, str]:
  """Runs each case in a fresh worker subprocess (`python -m benchmarks.rl --worker`, under
  python[framework] when given, else this interpreter) within `budget` seconds, writing OUT/name.json and
  .md after every case; returns (rows, markdown)."""
  device, rows, t_all, md = gpu.device_name(), [], time.perf_counter(), ""
  for c in cases:
    left = budget - (time.perf_counter() - t_all)
    if left < 20:
      rows.append(dict(c, error=f"not run: the {budget:.0f} s budget was spent"))
      continue
    env = gpu.jax_env() if c["framework"] != "trl" else dict(os.environ)
    argv = gpu.worker_argv("benchmarks.rl", "--worker", json.dumps(c))
    argv[0] = (python or {}).get(c["framework"]) or argv[0]
    t = time.perf_counter()
    res = gpu.run_worker(argv, env=env, timeout=min(timeout, left))
    row = dict(c, **res)
    rows.append(row)
    msg = (f"step {row['timed']['step']:.2f}s (rollout {row['timed']['rollout']:.2f}, update "
           f"{row['timed']['update']:.2f})" if "timed" in row else row.get("error", "?"))
    print(f"[{name}] {c['model']} {case_label(c)}: {msg} ({time.perf_counter() - t:.0f}s wall)", file=sys.stderr,
          flush=True)
    md = write_outputs(out_dir, rows, device, command, smoke, t_all, name=name, **report_kw)
  return rows, md


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--smoke", action="store_true", help="tiny shape on any device; RESULTS.md untouched")
  p.add_argument("--steps", type=int, default=2, help="timed steps (default 2)")
  p.add_argument("--warmup", type=int, default=1, help="untimed steps, the first compiles (default 1)")
  p.add_argument("--models", nargs="*", default=None, help=f"subset of {list(SHAPES)}")
  p.add_argument("--frameworks", nargs="*", default=None, help=f"subset of {list(FRAMEWORKS)}")
  p.add_argument("--trl-micro", type=int, default=32, help="TRL per-device micro-batch (rows)")
  p.add_argument("--tunix-remat", default="NONE", choices=("NONE", "BLOCK", "DECODER"),
                 help="tunix Llama3 RematConfig (DECODER fails in tunix 0.1.7's sampler with flax 0.12.8)")
  p.add_argument("--quant", default="none", choices=("none", "nf4"), help="fineflax's frozen base: bf16 or NF4 "
                 "(QLoRA; FINEFLAX_NF4_LAYOUT picks its decode layout)")
  p.add_argument("--timeout", type=float, default=200.0, help="seconds per case")
  p.add_argument("--budget", type=float, default=340.0, help="seconds for all cases; later cases get what is left")
  p.add_argument("--out", default=os.environ.get("OUT", str(pathlib.Path(__file__).with_name("out"))))
  p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    gpu.print_result(worker(json.loads(args.worker)))
    sys.stderr.flush()
    os._exit(0)  # a framework's leftover threads (tunix's rollout executor) must not hold the exit
  command = "python -m benchmarks.rl " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
  out_dir, t_all = pathlib.Path(args.out), time.perf_counter()
  rows, md = run_cases(cases(args), command=command.strip(), out_dir=out_dir, smoke=args.smoke,
                       budget=args.budget, timeout=args.timeout)
  print(md)
  if not args.smoke:
    write_section("rl", md)
  print(f"[rl] wrote {out_dir}/rl.json, rl.md" + ("" if args.smoke else " and RESULTS.md section 'rl'")
        + f" in {time.perf_counter() - t_all:.0f}s", file=sys.stderr)
  return 0 if all("timed" in r for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
