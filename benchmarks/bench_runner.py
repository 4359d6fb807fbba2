"""Generation throughput of `python -m fineflax.evals.bench` vs the same rows through fineflax.sampling.generate.

Rows: the GSM8K-format sample (fineflax/data/samples/gsm8k_test.jsonl) plus --problems held-out arithmetic
word problems (fineflax.envs.word_problems, 1-3 operations) written as GSM8K rows ("#### answer"), each
with --n samples at temperature 0.6, top-p 0.95.
  generate  the chat-formatted prompts, n copies each, in calls of --batch-size completions (each call ends
            with its longest row); timed on a second pass, after compilation
  runner    fineflax.evals.bench.run on the same file (tokenise, decode --batch-size completions at once on
            one engine, a finished row's slots refilled in waves of --admit, grade with math-verify in
            processes, append generations.jsonl from a thread); timed on a second run into a fresh folder
            after a first (warm-up) run into another, as generate's second pass: the seconds from the first
            tokenisation to the last line written (model load excluded)
Both columns count the XLA compilations of their timed pass (0 when warm). tokens/s = completion tokens /
seconds (each path samples its own completions: same settings, its own keys); target: runner / generate
>= 1.0.

  python -m benchmarks.bench_runner [--model smollm2-135m-instruct] [--problems 256] [--n 8]
      [--max-new-tokens 256] [--batch-size 256] [--admit N] [--dtype bfloat16] [--out DIR] [--write]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
from benchmarks._results import markdown_table, write_section
from fineflax.io import atomic_write_text
from fineflax.engine.compiles import CompileCounter


def write_rows(folder: pathlib.Path, problems: int) -> pathlib.Path:
  from fineflax.data.sources import sample_file
  from fineflax.envs.word_problems import generate_problems
  lines = sample_file("gsm8k_test.jsonl").read_text().splitlines()
  for p in generate_problems(problems, "test", (1, 3), seed=1):
    lines.append(json.dumps({"question": p.question, "answer": f"{p.solution}\n#### {p.answer}"}))
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / "gsm8k_test.jsonl"
  path.write_text("\n".join(lines) + "\n")
  return path


def direct(args, path, compiles: CompileCounter) -> tuple[float, int, int]:
  """(seconds, completion tokens, compilations) of generate's second pass over the rows, in the runner's
  batches."""
  import jax

  from fineflax.data.rl_prompts import FORMATS, load_prompts
  from fineflax.evals.variants import load_local
  from fineflax.sampling import chat_prompt_ids, generate
  params, config, tok, lora, scale, dtype = load_local(args.model, dtype=args.dtype)
  rows = list(load_prompts(str(path), FORMATS["gsm8k"]))
  per = max(args.batch_size // args.n, 1)
  out = None
  for _ in range(2):  # the first pass compiles
    compiles.start()
    t0, tokens = time.perf_counter(), 0
    for b in range(0, len(rows), per):
      ids = [p for r in rows[b:b + per] for p in [chat_prompt_ids(tok, r.messages)] * args.n]
      res = generate(params, config, ids, max_new_tokens=args.max_new_tokens, temperature=0.6, top_p=0.95,
                     tokenizer=tok, dtype=dtype, rng=jax.random.fold_in(jax.random.PRNGKey(0), b))
      tokens += int(res.lengths.sum())
    out = (time.perf_counter() - t0, tokens, compiles.count)
  return out


def runner(args, folder: pathlib.Path, compiles: CompileCounter) -> tuple[dict, dict, dict]:
  """(timing, gsm8k summary) of the runner's second run, and the first (warm-up) run's timing."""
  from fineflax.evals import bench
  runs = []
  for name in ("bench_warmup", "bench"):
    out = folder / name
    shutil.rmtree(out, ignore_errors=True)
    ns = bench.build_parser().parse_args(
        ["--model", args.model, "--benchmarks", "gsm8k", "--data-dir", str(folder), "--n", str(args.n),
         "--temperature", "0.6", "--top-p", "0.95", "--max-new-tokens", str(args.max_new_tokens),
         "--batch-size", str(args.batch_size), "--dtype", args.dtype, "--out", str(out),
         *(["--admit", str(args.admit)] if args.admit else [])])
    compiles.start()
    result = bench.run(ns)
    runs.append(dict(result["timing"], compiles=compiles.count, compile_seconds=compiles.seconds))
  return runs[1], result["summary"]["gsm8k"], runs[0]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", default="smollm2-135m-instruct")
  ap.add_argument("--problems", type=int, default=256)
  ap.add_argument("--n", type=int, default=8)
  ap.add_argument("--max-new-tokens", type=int, default=256)
  ap.add_argument("--batch-size", type=int, default=256)
  ap.add_argument("--admit", type=int, default=0, help="the runner's --admit (0: its default)")
  ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
  ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "bench_runner"))
  ap.add_argument("--write", action="store_true", help="write the section of benchmarks/RESULTS.md")
  args = ap.parse_args(argv)
  import jax
  folder = pathlib.Path(args.out)
  path = write_rows(folder, args.problems)
  compiles = CompileCounter()
  g_s, g_tok, g_compiles = direct(args, path, compiles)
  timing, summary, warm = runner(args, folder, compiles)
  r_s, r_tok = timing["seconds"], timing["tokens"]
  device = jax.devices()[0].device_kind
  rows = [["generate", g_s, g_tok, g_tok / g_s, g_compiles],
          ["bench runner", r_s, r_tok, r_tok / r_s, timing["compiles"]]]
  table = markdown_table(["path", "seconds", "completion tokens", "tokens/s", "compilations"], rows)
  ratio = (r_tok / r_s) / (g_tok / g_s)
  text = (f"## Benchmark runner vs generate (benchmarks/bench_runner.py)\n\n"
          f"{args.model} ({args.dtype}) on {device}, {time.strftime('%Y-%m-%d')}: {8 + args.problems} GSM8K-format "
          f"rows (the sample + {args.problems} arithmetic problems) x {args.n} samples, T=0.6, top-p 0.95, "
          f"max {args.max_new_tokens} new tokens, {args.batch_size} completions decoded at once (generate: calls "
          f"of {args.batch_size} completions; runner: one engine, finished rows' slots refilled in waves of "
          f"{timing['wave']} completions). Each path timed on its second pass (generate) or run (runner, into a "
          f"fresh folder), after a first one that compiled.\n\n{table}\n\n"
          f"runner / generate tokens/s: {ratio:.2f} (target >= 1.0). The runner's {r_s:.1f} s: tokenising "
          f"{timing['prepare_seconds']:.2f} s, engine steps {timing['engine_seconds']:.1f} s ({timing['steps']} steps, "
          f"{timing['prefill_calls']} prefill and {timing['decode_calls']} decode calls), its own host work "
          f"between steps {timing['host_seconds']:.2f} s, the wait for the last grades and writes "
          f"{timing['final_grading_wait_seconds']:.2f} s ({timing['grade_workers']} grading processes); admissions "
          f"(completions: times) {timing['admissions']}. Its first run took {warm['seconds']:.1f} s with "
          f"{warm['compiles']} compilations ({warm['compile_seconds']:.1f} s of compiling). avg@{args.n} "
          f"{100 * summary['avg_at_n']['value']:.1f}%, pass@{args.n} {100 * summary['pass_at_n']['value']:.1f}%.\n")
  print(text)
  atomic_write_text(folder / "results.md", text)
  if args.write:
    write_section("bench_runner", text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
