"""The serving / feedback adaptation loop end to end, on CPU with SmolLM2-135M-Instruct (NF4 base).

  python -m experiments.adaptation_loop.run --reference-eval   # the committed run: ~20 min on 2 busy CPU cores
  python -m experiments.adaptation_loop.run --smoke --model TINY_HF_DIR --out DIR --min-reward 0
      # tests/test_adaptation_loop_smoke.py: a tiny random model; ~2 min of CPU, mostly compiles

1. Two variants from one NF4 base, both real QLoRA adapters made by the SFT job (`launch.py --config
   configs/quickstart.py`): `tuned` on the bundled arithmetic chats, `noisy` on the same chats with every
   result shifted by a random non-zero d in [-9, 9] (a fine-tune on buggy labels: right format, wrong sums).
2. `python -m fineflax.serve` serves both; simulated users (threads with the `openai` client) ask held-out
   style questions with model="auto" (greedy) and POST reward 1/0 (the registry's math_last_number) to
   /feedback. 3. The router (Thompson sampling) moves the traffic to the better variant: share of the last
   requests, rolling share and cumulative pseudo-regret. 4. `python -m fineflax.data.from_feedback` turns
   the reward log into SFT rows (reward >= --min-reward) and preference pairs. 5. The SFT job continues the
   weak variant's adapter (`config.lora.init_from`) on those rows. 6. `python -m fineflax.evals` compares
   noisy-before with noisy-after on held-out questions no user asked (exact match, math_last_number,
   bootstrap 95% CI); with --reference-eval also tuned vs noisy-after. Writes results.json,
   RESULTS.md, adaptation_loop.png, the two eval reports and the runs under --out/work.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import shutil
import subprocess
import sys
import time


from experiments.adaptation_loop import loop
from experiments.adaptation_loop.report import plot, write_markdown
from experiments.common import command_line, device_name
from fineflax.io import atomic_write_json
from fineflax.runs import add_output_args, output_folder_or_exit

FULL = dict(variant_steps=8, feedback_steps=8, requests=120, eval_questions=64, users=8, max_tokens=16,
            last=50, batch_size=4)
SMOKE = dict(variant_steps=2, feedback_steps=2, requests=16, eval_questions=8, users=4, max_tokens=8,
             last=8, batch_size=4)


def run_cmd(argv: list[str], log: pathlib.Path, commands: list) -> float:
  """Runs a CLI (from the repository root, output to `log`); returns its wall time; raises on failure."""
  argv = [_relative(a) for a in argv]  # paths inside the repository as relative ones (cwd = the root)
  commands.append(" ".join(["python"] + [shlex.quote(a) for a in argv[1:]]))
  print(f"[{time.strftime('%H:%M:%S')}] {' '.join(argv[1:4])} ... (output: {log})", flush=True)  # progress
  t0 = time.time()
  with open(log, "w") as f:
    rc = subprocess.run(argv, cwd=loop.ROOT, env=loop.env_with_root(log.parent / "jax_cache"), stdout=f,
                        stderr=subprocess.STDOUT).returncode
  if rc != 0:
    raise SystemExit(f"{argv[:4]} failed with exit code {rc}; see {log}:\n{log.read_text()[-3000:]}")
  print(f"  done in {time.time() - t0:.0f} s", flush=True)
  return time.time() - t0


def _relative(command: str) -> str:
  return command.replace(str(loop.ROOT) + "/", "")


def sft_argv(model: str, workdir, sources, steps: int, s: dict, init_from: str = "", sft_set=()) -> list[str]:
  argv = [sys.executable, "launch.py", "--config", "configs/quickstart.py", "--workdir", str(workdir),
          f"--config.model.source={model}", f"--config.data.sources={sources}", "--config.data.eval_sources=",
          f"--config.optimizer.num_steps={steps}", f"--config.checkpoint.every={steps}",
          f"--config.eval_every={steps}", f"--config.data.batch_size={s['batch_size']}", "--config.sample_prompt="]
  argv += [f"--config.{kv}" for kv in sft_set]
  return argv + ([f"--config.lora.init_from={init_from}"] if init_from else [])


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="smollm2-135m-instruct", help="base model (alias, HF folder or .gguf)")
  add_output_args(ap, "adaptation_loop")
  ap.add_argument("--smoke", action="store_true", help="smallest settings (for a tiny test model)")
  ap.add_argument("--min-reward", type=float, default=1.0,
                  help="reward log rows kept as SFT data (the smoke test's random model needs 0)")
  ap.add_argument("--router", default="thompson", choices=("thompson", "ucb1"))
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--sft-set", nargs="*", default=[],
                  help="configs/quickstart.py overrides key=value for the three SFT runs (e.g. lora.targets=...)")
  ap.add_argument("--reference-eval", action="store_true",
                  help="also A/B tuned vs noisy-after on the held-out questions (~4 more minutes)")
  for k, v in FULL.items():
    ap.add_argument("--" + k.replace("_", "-"), type=int, default=None, help=f"default {v} (smoke {SMOKE[k]})")
  args = ap.parse_args(argv)
  output_folder_or_exit(args.out, args.overwrite)
  s = {k: getattr(args, k) if getattr(args, k) is not None else (SMOKE if args.smoke else FULL)[k] for k in FULL}
  out = pathlib.Path(args.out).resolve()
  work = out / "work"
  work.mkdir(parents=True, exist_ok=True)
  for stale in [*work.glob("sft_*"), *work.glob("feedback*"), *out.glob("eval_*")]:  # a rerun starts afresh
    shutil.rmtree(stale) if stale.is_dir() else stale.unlink()  # (the SFT job would resume a finished run)
  commands, times, t_start = [], {}, time.time()

  # data: users' questions and held-out questions are disjoint slices of one list
  qs = loop.make_questions(s["requests"] + s["eval_questions"], seed=args.seed)
  user_qs, held_qs = qs[:s["requests"]], qs[s["requests"]:]
  eval_path, noisy_path = work / "heldout_eval.jsonl", work / "noisy_train.jsonl"
  loop.write_jsonl(eval_path, loop.eval_rows(held_qs))
  loop.write_jsonl(noisy_path, loop.noisy_chats(seed=args.seed))

  # 1. the two variants (QLoRA adapters over one NF4 base)
  adapters = {}
  for name, src in (("tuned", "arithmetic_messages.jsonl"), ("noisy", str(noisy_path))):
    wd = work / f"sft_{name}"
    times[f"sft_{name}_s"] = run_cmd(sft_argv(args.model, wd, src, s["variant_steps"], s, sft_set=args.sft_set),
                                     work / f"sft_{name}.log", commands)
    adapters[name] = str(wd / "adapter")

  # 2-3. serve both, simulated users with feedback, the router converges
  port = loop.free_port()
  db = work / "feedback.sqlite"
  serve_argv = ["--model", args.model, "--name", "base", "--quant", "nf4", "--dtype", "float32",
                "--adapter", f"tuned={adapters['tuned']}", "--adapter", f"noisy={adapters['noisy']}",
                "--auto-variants", "tuned,noisy", "--router", args.router, "--slots", str(s["users"]),
                "--context", "256", "--chunk", "8", "--max-tokens-limit", "64", "--log", str(db),
                "--port", str(port)]
  serve_argv = [_relative(a) for a in serve_argv]
  commands.append("python -m fineflax.serve " + " ".join(shlex.quote(a) for a in serve_argv))
  t0 = time.time()
  proc, url = loop.start_server(serve_argv, work / "serve.log", cache_dir=work / "jax_cache")
  times["serve_start_s"] = time.time() - t0
  try:
    t0 = time.time()
    records = loop.simulate_users(url, user_qs, users=s["users"], max_tokens=s["max_tokens"])
    times["users_s"] = time.time() - t0
    stats = loop.get_json(url + "/rl/stats")
  finally:
    proc.terminate()
    proc.wait(timeout=60)
  routing = loop.routing_metrics(records, ["tuned", "noisy"], s["last"])
  loop.write_jsonl(work / "requests.jsonl", records)

  # 4. reward log -> SFT data (+ preference pairs)
  sft_data, pairs = work / "feedback_sft.jsonl", work / "feedback_pairs.jsonl"
  times["from_feedback_s"] = run_cmd(
      [sys.executable, "-m", "fineflax.data.from_feedback", "--log", str(db), "--min-reward", str(args.min_reward),
       "--out", str(sft_data), "--pairs-out", str(pairs)], work / "from_feedback.log", commands)
  counts = json.loads((work / "from_feedback.log").read_text().strip().splitlines()[-1])
  sft_rows = [json.loads(line) for line in sft_data.read_text().splitlines() if line.strip()]
  if not sft_rows:
    raise SystemExit(f"{sft_data}: no reward log row reached --min-reward {args.min_reward}; nothing to train on")

  # 5. SFT continues the weak variant's adapter on the feedback data
  wd = work / "sft_feedback"
  times["sft_feedback_s"] = run_cmd(sft_argv(args.model, wd, str(sft_data), s["feedback_steps"], s,
                                             init_from=adapters["noisy"], sft_set=args.sft_set),
                                    work / "sft_feedback.log", commands)
  adapters["noisy_after"] = str(wd / "adapter")

  # 6. A/B on held-out questions: weak before vs weak after (the judge is skipped: see RESULTS.md)
  def ab_eval(a: str, b: str, eval_dir: pathlib.Path, log: str) -> float:  # fineflax.evals A/B: a vs b adapters
    return run_cmd([sys.executable, "-m", "fineflax.evals", "--a", f"{args.model}+{adapters[a]}",
                    "--b", f"{args.model}+{adapters[b]}", "--data", str(eval_path), "--rewards", "math_last_number",
                    "--max-tokens", str(s["max_tokens"]), "--local-quant", "nf4", "--resamples", "2000",
                    "--out", str(eval_dir)], work / log, commands)

  eval_dir = out / "eval_noisy_before_vs_after"
  times["evals_s"] = ab_eval("noisy", "noisy_after", eval_dir, "evals.log")
  ab = json.loads((eval_dir / "results.json").read_text())
  ref_dir, ab_ref = out / "eval_tuned_vs_noisy_after", None
  if args.reference_eval:  # for scale: the better variant against the weak one after its SFT
    times["evals_reference_s"] = ab_eval("tuned", "noisy_after", ref_dir, "evals_reference.log")
    ab_ref = json.loads((ref_dir / "results.json").read_text())
  times["total_s"] = time.time() - t_start

  user_set = {q["question"] for q in user_qs}
  result = {
      "command": command_line() if argv is None else "python -m experiments.adaptation_loop.run " + " ".join(argv),
      "device": device_name(), "date": time.strftime("%Y-%m-%d %H:%M"), "settings": s,
      "router": args.router, "min_reward": args.min_reward, "model": args.model, "commands": commands,
      "times": times, "routing": routing, "server_stats": stats,
      "feedback_data": {**counts, "sft_rows": len(sft_rows),
                        "sft_rows_by_variant": {v: sum(r["variant"] == v for r in sft_rows) for v in ("tuned", "noisy")}},
      "heldout_disjoint_from_users": not any(q["question"] in user_set for q in held_qs),
      "ab": ab, "ab_reference": ab_ref,
      "eval_report": str(eval_dir.relative_to(out) / "report.md"),
      "eval_reference_report": str(ref_dir.relative_to(out) / "report.md") if ab_ref else None,
  }
  atomic_write_json(out / "results.json", result, indent=1)
  plot(result, out / "adaptation_loop.png")
  write_markdown(result, out / "RESULTS.md")
  print((out / "RESULTS.md").read_text())
  return result


if __name__ == "__main__":
  main()
