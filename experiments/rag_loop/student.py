"""The student step of the RAG loop: SFT of one student on the logged rows WITH the context its teachers saw
and of the same student on the same rows WITHOUT it, both answer the held-out questions, then the student
joins the routed arms (`new_arm.py`).

  python -m experiments.rag_loop.student --model /root/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      [--steps 300] [--out experiments/rag_loop/student]          (GPU: `bash benchmarks/run_gpu.sh rag_student`)
  python -m experiments.rag_loop.student --model TINY_HF_DIR --smoke --out DIR     (tests/test_rag_student.py)

Needs run.py's work/ (sft_context.jsonl, sft_no_context.jsonl, corpus.jsonl) and work/heldout_prompts.jsonl
(heldout.py: the held-out questions with the context of their category's best arm, computed on CPU and
committed, so this step needs no embedder, FAISS or sentence-transformers; --regen-heldout recomputes it with
--model's tokenizer, where the embedder is installed). Both SFT runs are `launch.py --config configs/quickstart.py`
(QLoRA, same steps, batch, length, seed) on their rows. The context student answers each held-out question from
its held-out row's "input", the no-context student from the question alone, each as it was trained (greedy).
Score: exact match after SQuAD normalisation; per question the paired difference (context - no context),
mean and bootstrap 95% CI (fineflax.stats), overall and per category. --limit N: the first N held-out
questions of each category.

Writes under --out: student.json (scores, every answer in "per_question"), STUDENT.md, student_rag.json (the
served variants: the five arms and student_<arm> = that arm's retrieval with the student adapter as generator,
for `python -m fineflax.serve --adapter student=DIR --rag-config student_rag.json`; STUDENT.md gives the line),
and new_arm.json / new_arm.png (`new_arm.py` on these answers; its RESULTS.md block is written on CPU later).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

import numpy as np

from experiments.adaptation_loop.run import run_cmd, sft_argv
from experiments.rag_loop import heldout
from experiments.rag_loop.arms import ARMS
from fineflax.io import atomic_write_json, atomic_write_text
from fineflax.runs import add_output_args, output_folder_or_exit

HERE = pathlib.Path(__file__).resolve().parent
SMOKE = {"steps": 2, "batch_size": 2, "max_length": 256, "limit": 2, "max_tokens": 4, "new_arm_seeds": 1,
         "new_arm_steps": 150}
FULL = {"steps": 300, "batch_size": 16, "max_length": 384, "limit": 0, "max_tokens": 16, "new_arm_seeds": 10,
        "new_arm_steps": 3000}
HELP = {"steps": "SFT steps of each student", "batch_size": "SFT rows per step",
        "max_length": "tokens per SFT row (context rows are ~150-250)",
        "limit": "first N held-out questions of each category (0 = all)", "max_tokens": "answer tokens",
        "new_arm_seeds": "seeds of new_arm.py", "new_arm_steps": "new_arm.py's requests before and after the join"}


def per_category_limit(rows: list[dict], limit: int) -> list[dict]:
  """The first `limit` rows of each category, in file order (all rows for 0)."""
  if not limit:
    return rows
  seen: dict[str, int] = {}
  out = []
  for r in rows:
    seen[r["category"]] = seen.get(r["category"], 0) + 1
    if seen[r["category"]] <= limit:
      out.append(r)
  return out


def served_config(corpus: pathlib.Path, best: set[str]) -> dict:
  """The `fineflax.rag.spec` config of the five arms and student_<arm> (generator "student") for each arm
  in `best`: retrievers named as arms.ARMS names them, over `corpus`."""
  fields = lambda v: {"kind": v.kind, **({"retriever": v.retriever, "k": v.k} if v.retrieves else {}),
                      **({"max_turns": v.max_turns, "max_turn_tokens": v.max_turn_tokens}
                         if v.kind == "agentic_rag" else {})}
  retrievers = {r: {"kind": r, "corpus": str(corpus)} for r in sorted({v.retriever for v in ARMS.values()} - {None})}
  variants = {name: fields(v) for name, v in ARMS.items()}
  variants.update({f"student_{a}": {**fields(ARMS[a]), "generator": "student"} for a in sorted(best)})
  return {"retrievers": retrievers, "variants": variants}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--work", default=str(HERE / "work"))
  ap.add_argument("--heldout", default=None, help=f"held-out prompts (default: --work/{heldout.FILE})")
  ap.add_argument("--regen-heldout", action="store_true",
                  help="recompute the held-out prompts first (needs the embedder; run.py's results.json)")
  ap.add_argument("--results", default=None, help="run.py's results.json, for --regen-heldout (default: beside --work)")
  ap.add_argument("--embedder", default="all-MiniLM-L6-v2", help="for --regen-heldout")
  ap.add_argument("--model", default="smollm2-135m-instruct", help="base model (alias, HF folder or .gguf)")
  ap.add_argument("--smoke", action="store_true", help="smallest settings (for a tiny test model)")
  for k, v in FULL.items():
    ap.add_argument("--" + k.replace("_", "-"), type=int, default=None, help=f"{HELP[k]} (default {v}, smoke {SMOKE[k]})")
  ap.add_argument("--sft-set", nargs="*", default=[], help="configs/quickstart.py overrides key=value for both SFT runs")
  add_output_args(ap, "rag_loop_student")
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)
  output_folder_or_exit(args.out, args.overwrite)
  s = {k: getattr(args, k) if getattr(args, k) is not None else (SMOKE if args.smoke else FULL)[k] for k in FULL}
  work, out = pathlib.Path(args.work).resolve(), pathlib.Path(args.out).resolve()
  held = pathlib.Path(args.heldout).resolve() if args.heldout else work / heldout.FILE
  out.mkdir(parents=True, exist_ok=True)
  for path in (work / n for n in ("sft_context.jsonl", "sft_no_context.jsonl", "corpus.jsonl")):
    if not path.is_file():
      print(f"error: {path} is missing; run `python -m experiments.rag_loop.run` first", file=sys.stderr)
      return 2
  if args.regen_heldout:
    output_folder_or_exit(held, args.overwrite, "--heldout")
    heldout.write(held, heldout.compute(work, args.results, args.model, args.embedder))
  try:
    rows = per_category_limit(heldout.load(held), s["limit"])
  except (OSError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2

  t0, commands, times, adapters = time.time(), [], {}, {}
  sft_set = [f"data.max_length={s['max_length']}", f"seed={args.seed}", *args.sft_set]
  for name in ("context", "no_context"):
    wd = out / f"sft_{name}"
    times[f"sft_{name}_s"] = run_cmd(sft_argv(args.model, wd, str(work / f"sft_{name}.jsonl"), s["steps"], s,
                                              sft_set=sft_set), out / f"sft_{name}.log", commands)
    adapters[name] = str(wd / "adapter")

  prompts = {"context": [r["input"] for r in rows],
             "no_context": [[{"role": "user", "content": r["question"]}] for r in rows]}
  from fineflax.evals.variants import local_variant
  from fineflax.rewards.qa import exact_match_score
  from fineflax.stats import mean_ci
  answers, scores = {}, {}
  for name in ("context", "no_context"):
    t = time.time()
    answers[name] = local_variant(args.model, adapters[name], max_tokens=s["max_tokens"], seed=args.seed)(prompts[name])
    times[f"eval_{name}_s"] = time.time() - t
    scores[name] = np.array([exact_match_score(a, [r["answer"]]) for a, r in zip(answers[name], rows)])
  diff = scores["context"] - scores["no_context"]
  cats = sorted({r["category"] for r in rows})
  atomic_write_json(out / "student_rag.json", served_config(work / "corpus.jsonl", {r["arm"] for r in rows}), indent=2)
  serve = (f"python -m fineflax.serve --model {args.model} --adapter student={adapters['context']} "
           f"--rag-config {out / 'student_rag.json'} --router thompson")
  result = {"model": args.model, "steps": s["steps"], "questions": len(rows), "settings": s, "commands": commands,
            "em": {n: float(v.mean()) for n, v in scores.items()}, "context_minus_no_context": mean_ci(diff),
            "per_category": {c: {"n": int(m.sum()), "em_context": float(scores["context"][m].mean()),
                                 "em_no_context": float(scores["no_context"][m].mean()),
                                 "diff": mean_ci(diff[m])}
                             for c in cats for m in [np.array([r["category"] == c for r in rows])]},
            "per_question": [{"id": r["id"], "category": r["category"], "arm": r["arm"], "answer": r["answer"],
                              "context": a, "no_context": b, "em_context": float(x), "em_no_context": float(y)}
                             for r, a, b, x, y in zip(rows, answers["context"], answers["no_context"],
                                                      scores["context"], scores["no_context"])],
            "adapters": adapters, "serve": serve,
            "seconds": {**{k: round(v, 1) for k, v in times.items()}, "total": round(time.time() - t0, 1)}}
  atomic_write_json(out / "student.json", result, indent=2)
  d = result["context_minus_no_context"]
  lines = ["# RAG loop: the student with vs without context", "",
           f"Model {args.model}, QLoRA SFT {s['steps']} steps each, {len(rows)} held-out questions, "
           f"{result['seconds']['total']:.0f} s.", "",
           "| category | n | EM with context | EM without | difference (95% CI) |", "|---|---|---|---|---|"]
  for c, r in result["per_category"].items():
    lines.append(f"| {c} | {r['n']} | {r['em_context']:.3f} | {r['em_no_context']:.3f} | "
                 f"{r['diff']['value']:+.3f} ({r['diff']['lo']:+.3f}, {r['diff']['hi']:+.3f}) |")
  lines.append(f"| all | {len(rows)} | {result['em']['context']:.3f} | {result['em']['no_context']:.3f} | "
               f"{d['value']:+.3f} ({d['lo']:+.3f}, {d['hi']:+.3f}) |")
  lines += ["", "The student served as a RAG variant (each category's best arm's retrieval, the adapter as "
            "generator; student_agentic_rag lets the student drive the searches, where the answers above used "
            "the rule reader's passages):", "", f"    {serve}", "", "Commands:", "", *[f"    {c}" for c in commands]]
  atomic_write_text(out / "STUDENT.md", "\n".join(lines) + "\n")
  print("\n".join(lines[4:4 + len(cats) + 3]))

  from experiments.rag_loop import new_arm
  steps = str(s["new_arm_steps"])
  new_arm.main(["--student", str(out / "student.json"), "--heldout", str(held), "--out", str(out),
                "--results-md", "", "--before", steps, "--after", steps, "--seeds", str(s["new_arm_seeds"])])
  return 0


if __name__ == "__main__":
  sys.exit(main())
