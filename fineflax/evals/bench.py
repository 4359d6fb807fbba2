"""Benchmark runner: avg@n and pass@n of a model on the papers' evaluation files, resumable.

  python -m fineflax.evals.bench --model SOURCE [--adapter PEFT_DIR] --benchmarks math500,aime24,nq \
      --data-dir DIR [--files F,...] --n 8 --temperature 0.6 --top-p 0.95 --max-new-tokens 8192 --out DIR

Rows come from LUFFY's valid.parquet, Search-R1's test parquets, GSM8K or MATH files (found by data source:
`fineflax.evals.benchmarks`); each row's prompt (its chat messages, the system turn dropped with
--drop-system as LUFFY's script does) gets n completions from one generation engine (`fineflax.engine`):
--batch-size completions decode at once and a finished row's slots go to the next rows, handed to the
engine in waves of --admit completions (`fineflax.evals.bench_decode`); sample j of a row is drawn with its
own key (from --seed, the row and j), whatever the batching. Finished rows are graded by the benchmark's
grader (in --grade-workers processes) and appended by a background thread while the engine decodes.
Per benchmark (over its R rows, c_r correct of n):
  avg@n  = mean_r c_r / n                      (greedy accuracy when n = 1 and temperature 0)
  pass@n = mean_r 1[c_r > 0]                   (= the unbiased pass@k estimate at k = n)
with 95% bootstrap intervals over rows (`fineflax.stats.mean_ci`). Writes OUT/generations.jsonl (one
line per completion, appended batch by batch), OUT/results.json and OUT/results.md, and prints the table.
Resume: rerunning the same command skips every row whose n completions are already in generations.jsonl
(a line cut by a crash is dropped); a rerun with other settings is refused (exit 2) unless --out changes.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import pathlib
import sys
import time

import numpy as np

from fineflax.data.rl_prompts import FORMATS, load_prompts
from fineflax.data.sources import DataError
from fineflax.evals.bench_decode import Recorder, admission_wave, decode_rows, row_id, sample_keys
from fineflax.evals.benchmarks import BENCHMARKS, benchmark_of, discover
from fineflax.stats import mean_ci, pass_at_k
from fineflax.io import atomic_write_text

SETTINGS = ("model", "adapter", "n", "temperature", "top_p", "max_new_tokens", "seed", "think_gate",
            "drop_system", "quant", "dtype")


class BenchError(ValueError):
  """A user mistake (bad benchmark name, missing files, changed settings): one line, exit 2."""


def grade(benchmark: str, prompt_text: str, completion: str, example: dict, think_gate: str) -> bool:
  """The benchmark's grader (fineflax.evals.benchmarks) on one completion."""
  from fineflax.rewards import get_reward
  if BENCHMARKS[benchmark].grader == "qa":
    return get_reward("exact_match")(prompt_text, completion, **example) == 1.0
  gate = think_gate == "on" or (think_gate == "auto" and prompt_text.endswith("<think>\n"))
  return get_reward("math_think" if gate else "math")(prompt_text, completion, **example) == 1.0


def grade_all(jobs: list[tuple]) -> list[bool]:
  """`grade` over (benchmark, prompt text, completion, example, think_gate) tuples (run in a worker process)."""
  return [grade(*job) for job in jobs]


def default_grade_workers(cpus: int | None = None) -> int:
  """Grading processes when --grade-workers is not given: the CPUs left after this process and one spare,
  between 1 and 8 (`cpus` default os.cpu_count())."""
  return max(1, min(8, (cpus or os.cpu_count() or 1) - 2))


def load_rows(names, paths, *, dedupe: bool = False, limit: int = 0) -> dict[str, list]:
  """{benchmark: [PromptRow]} for the named benchmarks; rows keyed by `where` (file and row)."""
  found = discover(paths)
  missing = [n for n in names if n not in found]
  if missing:
    have = ", ".join(f"{k} ({v[0].name})" for k, v in sorted(found.items())) or "none"
    raise BenchError(f"no file holds benchmark(s) {missing} under {', '.join(map(str, paths))}; found: {have}")
  out = {}
  for name in names:
    path, fmt = found[name]
    rows = [r for r in load_prompts(str(path), FORMATS[fmt]) if benchmark_of(r.data_source) == name]
    if dedupe:  # LUFFY's files repeat AIME / AMC rows to average over samples; keep one of each
      seen, unique = set(), []
      for r in rows:
        key = (json.dumps(r.messages), json.dumps(r.ground_truth))
        if key not in seen:
          seen.add(key)
          unique.append(r)
      rows = unique
    out[name] = rows[:limit] if limit else rows
  return out


def read_generations(path: pathlib.Path) -> list[dict]:
  """The complete lines of generations.jsonl; a cut last line is dropped and the file rewritten without it."""
  if not path.exists():
    return []
  lines, records = path.read_text(encoding="utf-8").splitlines(keepends=True), []
  for i, line in enumerate(lines):
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      if i != len(lines) - 1:
        raise BenchError(f"{path}:line {i + 1}: not JSON (not a cut last line); move the file aside") from None
      atomic_write_text(path, "".join(lines[:-1]))
  return records


def completed(records: list[dict], n: int) -> dict[tuple[str, str], list[dict]]:
  """{(benchmark, row): its n records by sample index} for the rows with all n samples recorded (a later
  record of the same sample replaces an earlier one, e.g. a row regenerated after a crash cut it short)."""
  by_row: dict[tuple[str, str], dict[int, dict]] = {}
  for r in records:
    by_row.setdefault((r["benchmark"], r["row"]), {})[int(r["sample"])] = r
  return {k: [v[j] for j in range(n)] for k, v in by_row.items() if all(j in v for j in range(n))}


def summarize(records: list[dict], rows: dict[str, list], n: int) -> dict:
  """{benchmark: {rows, n, avg, pass, lengths...}} from the recorded completions (module docstring)."""
  out, samples = {}, completed(records, n)
  for name, items in rows.items():
    done = [samples[(name, item.where)] for item in items if (name, item.where) in samples]
    if not done:
      continue
    correct = np.array([[bool(r["correct"]) for r in row] for row in done])
    lengths = [r["length"] for row in done for r in row]
    truncated = [r["finish"] == "length" for row in done for r in row]
    out[name] = {"rows": len(done), "rows_total": len(items), "n": n,
                 "avg_at_n": mean_ci(correct.mean(1)), "pass_at_n": mean_ci(pass_at_k(correct, n)),
                 "mean_length": float(np.mean(lengths)), "truncated": float(np.mean(truncated))}
  if out:
    out["average"] = {"benchmarks": len(out), "avg_at_n": float(np.mean([v["avg_at_n"]["value"] for v in out.values()])),
                      "pass_at_n": float(np.mean([v["pass_at_n"]["value"] for v in out.values()]))}
  return out


def markdown(summary: dict, n: int) -> str:
  head = (f"| benchmark | rows | avg@{n} (95% CI) | pass@{n} (95% CI) | mean length | truncated |\n"
          "|---|---|---|---|---|---|\n")
  body = ""
  for name, s in summary.items():
    if name == "average":
      continue
    a, p = s["avg_at_n"], s["pass_at_n"]
    body += (f"| {name} | {s['rows']}/{s['rows_total']} | {100 * a['value']:.1f} ({100 * a['lo']:.1f}-{100 * a['hi']:.1f}) "
             f"| {100 * p['value']:.1f} ({100 * p['lo']:.1f}-{100 * p['hi']:.1f}) | {s['mean_length']:.0f} "
             f"| {100 * s['truncated']:.0f}% |\n")
  if "average" in summary:
    avg = summary["average"]
    body += f"| average ({avg['benchmarks']}) | | {100 * avg['avg_at_n']:.1f} | {100 * avg['pass_at_n']:.1f} | | |\n"
  return head + body


def check_settings(out: pathlib.Path, settings: dict) -> None:
  """Saves settings.json on the first run; a rerun with other settings raises BenchError naming them."""
  path = out / "settings.json"
  if path.exists():
    old = json.loads(path.read_text())
    diff = {k: (old.get(k), settings[k]) for k in settings if old.get(k) != settings[k]}
    if diff:
      raise BenchError(f"{out} holds a run with other settings {diff} (old, new); use another --out")
  else:
    atomic_write_text(path, json.dumps(settings, indent=1))


def run(args) -> dict:
  """Generates what generations.jsonl lacks, then writes results.json / results.md (module docstring)."""
  from fineflax.engine import Engine
  from fineflax.evals.variants import load_local
  from fineflax.sampling import format_chat
  from fineflax.sampling.session import engine_pool_pages
  names = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
  unknown = [b for b in names if b not in BENCHMARKS]
  if unknown or not names:
    raise BenchError(f"unknown benchmark(s) {unknown or names}; choose from {', '.join(BENCHMARKS)}")
  paths = [p for p in args.files.split(",") if p] if args.files else [args.data_dir]
  rows = load_rows(names, paths, dedupe=args.dedupe, limit=args.limit)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  settings = {k: getattr(args, k) for k in SETTINGS}
  check_settings(out, settings)
  gen_path = out / "generations.jsonl"
  records = read_generations(gen_path)
  done = completed(records, args.n)
  todo = [(name, item) for name, items in rows.items() for item in items if (name, item.where) not in done]
  skipped = sum(len(v) for v in rows.values()) - len(todo)
  print(f"{len(todo)} rows to generate ({skipped} already done) x {args.n} samples", file=sys.stderr, flush=True)
  timing = {"seconds": 0.0, "tokens": 0}  # this run's generation loop (model load excluded)
  workers = default_grade_workers() if args.grade_workers is None else args.grade_workers
  if todo:
    pool = None
    if workers:  # grading (math-verify) overlaps the generation
      pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
      for _ in range(workers):  # the workers import the graders while the model loads
        pool.submit(grade_all, [("math500", "", "\\boxed{1}", {"ground_truth": "1"}, "off")])
    params, config, tok, lora, scale, dtype = load_local(args.model, args.adapter or None, quant=args.quant,
                                                         dtype=args.dtype)
    live = max(args.batch_size // args.n, 1) * args.n  # completions decoded at once
    wave = admission_wave(live, args.n) if args.admit is None else min(max(args.admit // args.n, 1) * args.n, live)
    t0 = time.perf_counter()
    texts = [format_chat(tok, [m for m in item.messages if not (args.drop_system and m["role"] == "system")])
             for _, item in todo]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    keys = sample_keys(args.seed, [row_id(name, item.where) for name, item in todo], args.n)
    prepare_s = time.perf_counter() - t0
    longest = sorted((len(p) + args.max_new_tokens for p in prompts), reverse=True)[:live]
    engine = Engine(params, config, max_rows=live, num_pages=engine_pool_pages(longest, 16), tokenizer=tok,
                    lora=lora, lora_scale=scale, dtype=dtype)

    def record(r, j, text, seq):
      name, item = todo[r]
      rec = {"benchmark": name, "row": item.where, "sample": j, "data_source": item.data_source,
             "question": item.question, "ground_truth": item.ground_truth, "completion": text,
             "finish": seq.status, "length": len(seq.tokens)}
      return rec, (name, texts[r], text, item.example(), args.think_gate)

    done_rows = [0]

    def on_rows(finished):
      recorder.put(finished)
      done_rows[0] += len(finished)
      if done_rows[0] * args.n // live > (done_rows[0] - len(finished)) * args.n // live:  # every `live` completions
        print(f"  {done_rows[0]}/{len(todo)} rows, {recorder.tokens / (time.perf_counter() - t0):.0f} tokens/s",
              file=sys.stderr, flush=True)

    with open(gen_path, "a", encoding="utf-8") as f:
      recorder = Recorder(f, tok, record, grade_all, pool)
      stats = decode_rows(engine, prompts, keys, n=args.n, max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, top_p=args.top_p, wave=wave, live=live, on_rows=on_rows)
      wait_s = recorder.close()
    if pool is not None:
      pool.shutdown()
    timing = {"seconds": time.perf_counter() - t0, "tokens": recorder.tokens, "prepare_seconds": prepare_s,
              "engine_seconds": stats.engine_seconds, "host_seconds": stats.host_seconds, "steps": stats.steps,
              "final_grading_wait_seconds": wait_s, "grade_workers": workers, "live": live, "wave": wave,
              "admissions": {str(k): v for k, v in sorted(stats.admissions.items())},
              "prefill_calls": engine.stats["prefill_calls"], "decode_calls": engine.stats["decode_calls"]}
    records = read_generations(gen_path)
  summary = summarize(records, rows, args.n)
  result = {"settings": settings, "benchmarks": names, "summary": summary, "timing": timing}
  atomic_write_text(out / "results.json", json.dumps(result, indent=1))
  table = markdown(summary, args.n)
  atomic_write_text(out / "results.md", f"# {args.model}{' + ' + args.adapter if args.adapter else ''}\n\n"
                    f"n={args.n}, temperature={args.temperature}, top_p={args.top_p}, "
                    f"max_new_tokens={args.max_new_tokens}\n\n{table}")
  print(table)
  return result


def build_parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="python -m fineflax.evals.bench", description=__doc__.split("\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
  ap.add_argument("--model", required=True, help="HF folder, .gguf, hub name or alias")
  ap.add_argument("--adapter", default="", help="PEFT LoRA folder (e.g. a run's adapter/)")
  ap.add_argument("--benchmarks", required=True, help=f"comma-separated: {', '.join(BENCHMARKS)}")
  ap.add_argument("--data-dir", default=".", help="folder of evaluation files (files without 'train' in the name)")
  ap.add_argument("--files", default="", help="evaluation files, comma-separated (instead of --data-dir)")
  ap.add_argument("--n", type=int, default=1, help="completions per row")
  ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
  ap.add_argument("--top-p", type=float, default=1.0)
  ap.add_argument("--max-new-tokens", type=int, default=1024)
  ap.add_argument("--batch-size", type=int, default=64, help="completions decoded at once (rows x n)")
  ap.add_argument("--admit", type=int, default=None,
                  help="completions handed to the engine at once, whole rows, when that many of the "
                       "--batch-size slots are free (default `admission_wave`: an eighth of them; "
                       "--admit = --batch-size: fixed batches, each ending with its longest completion)")
  ap.add_argument("--think-gate", default="auto", choices=("auto", "on", "off"),
                  help="math: grade only the text after </think> (no tag = wrong); auto: when the prompt ends "
                       "with '<think>\\n' (LUFFY's eval script)")
  ap.add_argument("--drop-system", action="store_true", help="drop system turns (LUFFY: --remove_system True)")
  ap.add_argument("--dedupe", action="store_true", help="one row per repeated prompt (LUFFY repeats AIME/AMC)")
  ap.add_argument("--limit", type=int, default=0, help="first N rows of each benchmark (0 = all)")
  ap.add_argument("--quant", default="none", choices=("none", "nf4", "int8"), help="quantise the base")
  ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--grade-workers", type=int, default=None,
                  help="processes grading while the next batch generates (0 = grade in line; default "
                       "`default_grade_workers()`: math-verify took ~12-33 ms a completion, so two workers fell "
                       "behind a GPU decoding 26k tokens/s)")
  ap.add_argument("--out", default="runs/bench", help="output folder (default runs/bench) (generations.jsonl, results.json/.md)")
  return ap


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  for key in ("n", "max_new_tokens", "batch_size", "admit"):
    if getattr(args, key) is not None and getattr(args, key) < 1:
      print(f"error: --{key.replace('_', '-')}={getattr(args, key)}: must be >= 1", file=sys.stderr)
      return 2
  if args.grade_workers is not None and args.grade_workers < 0:
    print(f"error: --grade-workers={args.grade_workers}: must be >= 0", file=sys.stderr)
    return 2
  if args.temperature == 0 and args.n > 1:
    print("error: --n > 1 needs --temperature > 0 (greedy completions are all the same)", file=sys.stderr)
    return 2
  try:
    run(args)
  except (BenchError, DataError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
