"""The student step of the RAG loop: SFT of one student on the logged rows WITH the context its teachers saw
and of the same student on the same rows WITHOUT it, then both answer held-out questions of the KB.

  python -m experiments.rag_loop.student [--work experiments/rag_loop/work] [--model smollm2-135m-instruct]
      [--steps 300] [--out experiments/rag_loop/student]                    (GPU: see the report for the time)
  python -m experiments.rag_loop.student --model TINY_HF_DIR --steps 2 --limit 4 --max-length 256 --out DIR
      (the CPU smoke run of tests/test_rag_loop.py)

Needs `python -m experiments.rag_loop.run` first (work/: corpus, questions, sft_context.jsonl,
sft_no_context.jsonl, results.json). Both SFT runs are `launch.py --config configs/quickstart.py` (QLoRA,
same steps, batch, length, seed) on their rows. Held-out questions: the KB's "test" split (no user asked
them; their facts are in the corpus, never in a training answer). The context student answers from the
context of its category's best arm (results.json "best": the arm the router converged to), the no-context
student from the question alone, each as it was trained. Score: exact match after SQuAD normalisation;
per question the paired difference (context - no context), mean and bootstrap 95% CI (fineflax.stats),
overall and per category. Writes student.json and STUDENT.md under --out.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

from experiments.adaptation_loop.run import run_cmd, sft_argv
from experiments.rag_loop.arms import build_engines, run_arm
from fineflax.io import atomic_write_json, atomic_write_text, json_lines

HERE = pathlib.Path(__file__).resolve().parent


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--work", default=str(HERE / "work"))
  ap.add_argument("--results", default=None, help="run.py's results.json (default: beside --work)")
  ap.add_argument("--model", default="smollm2-135m-instruct")
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--batch-size", type=int, default=16)
  ap.add_argument("--max-length", type=int, default=384, help="tokens per SFT row (context rows are ~150-250)")
  ap.add_argument("--limit", type=int, default=0, help="first N held-out questions (0 = all)")
  ap.add_argument("--max-tokens", type=int, default=16)
  ap.add_argument("--embedder", default="all-MiniLM-L6-v2")
  ap.add_argument("--out", default=str(HERE / "student"))
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)
  work, out = pathlib.Path(args.work).resolve(), pathlib.Path(args.out).resolve()
  results = pathlib.Path(args.results) if args.results else work.parent / "results.json"
  out.mkdir(parents=True, exist_ok=True)
  for path in [*(work / n for n in ("sft_context.jsonl", "sft_no_context.jsonl", "questions.jsonl",
                                    "corpus.jsonl")), results]:
    if not path.is_file():
      print(f"error: {path} is missing; run `python -m experiments.rag_loop.run` first", file=sys.stderr)
      return 2
  t0, commands, times = time.time(), [], {}
  s = {"batch_size": args.batch_size}
  sft_set = [f"data.max_length={args.max_length}", f"seed={args.seed}"]
  adapters = {}
  for name in ("context", "no_context"):
    wd = out / f"sft_{name}"
    times[f"sft_{name}_s"] = run_cmd(sft_argv(args.model, wd, str(work / f"sft_{name}.jsonl"), args.steps, s,
                                              sft_set=sft_set), out / f"sft_{name}.log", commands)
    adapters[name] = str(wd / "adapter")

  questions = [q for _, q in json_lines(work / "questions.jsonl") if q["split"] == "test"]
  questions = questions[:args.limit] if args.limit else questions
  best = json.loads(results.read_text())["best"]
  docs = [d for _, d in json_lines(work / "corpus.jsonl")]
  from fineflax.models import load_tokenizer
  engines, tok = build_engines(docs, args.embedder), load_tokenizer("smollm2-135m-instruct")
  prompts = {"context": [run_arm(best[q["category"]], q["question"], engines, tok)["input"] for q in questions],
             "no_context": [[{"role": "user", "content": q["question"]}] for q in questions]}
  from fineflax.evals.variants import local_variant
  from fineflax.rewards.qa import exact_match_score
  from fineflax.stats import mean_ci
  answers, scores = {}, {}
  for name in ("context", "no_context"):
    t = time.time()
    answers[name] = local_variant(args.model, adapters[name], max_tokens=args.max_tokens, seed=args.seed)(prompts[name])
    times[f"eval_{name}_s"] = time.time() - t
    scores[name] = np.array([exact_match_score(a, [q["answer"]]) for a, q in zip(answers[name], questions)])
  diff = scores["context"] - scores["no_context"]
  cats = sorted({q["category"] for q in questions})
  result = {"model": args.model, "steps": args.steps, "questions": len(questions), "commands": commands,
            "em": {n: float(v.mean()) for n, v in scores.items()}, "context_minus_no_context": mean_ci(diff),
            "per_category": {c: {"n": int(m.sum()), "em_context": float(scores["context"][m].mean()),
                                 "em_no_context": float(scores["no_context"][m].mean()),
                                 "diff": mean_ci(diff[m])}
                             for c in cats for m in [np.array([q["category"] == c for q in questions])]},
            "examples": [{"question": q["question"], "answer": q["answer"], "context": a, "no_context": b}
                         for q, a, b in list(zip(questions, answers["context"], answers["no_context"]))[:20]],
            "seconds": {**{k: round(v, 1) for k, v in times.items()}, "total": round(time.time() - t0, 1)}}
  atomic_write_json(out / "student.json", result, indent=2)
  d = result["context_minus_no_context"]
  lines = ["# RAG loop: the student with vs without context", "",
           f"Model {args.model}, QLoRA SFT {args.steps} steps each, {len(questions)} held-out questions, "
           f"{result['seconds']['total']:.0f} s.", "",
           "| category | n | EM with context | EM without | difference (95% CI) |", "|---|---|---|---|---|"]
  for c, r in result["per_category"].items():
    lines.append(f"| {c} | {r['n']} | {r['em_context']:.3f} | {r['em_no_context']:.3f} | "
                 f"{r['diff']['value']:+.3f} ({r['diff']['lo']:+.3f}, {r['diff']['hi']:+.3f}) |")
  lines.append(f"| all | {len(questions)} | {result['em']['context']:.3f} | {result['em']['no_context']:.3f} | "
               f"{d['value']:+.3f} ({d['lo']:+.3f}, {d['hi']:+.3f}) |")
  lines += ["", "Commands:", "", *[f"    {c}" for c in commands]]
  atomic_write_text(out / "STUDENT.md", "\n".join(lines) + "\n")
  print("\n".join(lines[4:4 + len(cats) + 3]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
