"""The held-out questions of the student step, each with the context it is answered from, computed once on
CPU and committed: the dense and hybrid arms need the MiniLM embedder and FAISS, which the GPU machine lacks.

  python -m experiments.rag_loop.heldout [--work experiments/rag_loop/work] [--results FILE]
      [--tokenizer smollm2-135m-instruct]                                       (~1 min CPU; needs run.py's work/)

work/heldout_prompts.jsonl: one row per "test"-split question of work/questions.jsonl (no simulated user asked
them; their facts are in the corpus, never in a training answer), in that file's order:
  {"id", "category", "question", "answer",
   "arm": the category's best arm (results.json "best": the arm the router converged to),
   "input": the messages that arm puts in front of its generator (`arms.run_arm`),
   "correct": {arm: 0 / 1 for every arm of `arms.ARMS`: recall of the gold passage, as run.py measures it}}
The tokenizer only renders the agentic arm's Search-R1 prompt for its rule reader (arms.rule_reader).
"""
from __future__ import annotations

import argparse
import json
import pathlib

from experiments.rag_loop.arms import ARMS, build_engines, measure
from fineflax.runs import output_folder_or_exit
from fineflax.io import atomic_write_text, json_lines

HERE = pathlib.Path(__file__).resolve().parent
FILE = "heldout_prompts.jsonl"
FIELDS = ("id", "category", "question", "answer", "arm", "input", "correct")


def compute(work, results=None, tokenizer="smollm2-135m-instruct", embedder="all-MiniLM-L6-v2") -> list[dict]:
  """The rows of the module docstring from run.py's work/ and results.json (default: beside work/)."""
  work = pathlib.Path(work)
  best = json.loads(pathlib.Path(results or work.parent / "results.json").read_text())["best"]
  questions = [q for _, q in json_lines(work / "questions.jsonl") if q["split"] == "test"]
  docs = [d for _, d in json_lines(work / "corpus.jsonl")]
  if isinstance(tokenizer, str):
    from fineflax.models import load_tokenizer
    tokenizer = load_tokenizer(tokenizer)
  runs, correct = measure(questions, build_engines(docs, embedder), tokenizer)
  return [{"id": q["id"], "category": q["category"], "question": q["question"], "answer": q["answer"],
           "arm": best[q["category"]], "input": runs[q["id"]][best[q["category"]]]["input"],
           "correct": {a: int(c) for a, c in zip(ARMS, row)}} for q, row in zip(questions, correct)]


def write(path, rows: list[dict]) -> None:
  atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def load(path) -> list[dict]:
  """The rows of `path`; a missing file, a row without a field of FIELDS, an input that is not a list of
  {role, content} messages or a correctness that is not {arm: 0 | 1} for every arm raises ValueError
  naming the file, line and field."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"{path}: no such file; make it with `python -m experiments.rag_loop.heldout` "
                            "(or student.py --regen-heldout) where the embedder is installed")
  rows = []
  for line, row in json_lines(path):
    where = f"{path}:{line}"
    missing = [f for f in FIELDS if f not in row]
    if missing:
      raise ValueError(f"{where}: field {missing[0]!r} is missing (fields: {', '.join(FIELDS)})")
    if not (isinstance(row["input"], list) and row["input"]
            and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in row["input"])):
      raise ValueError(f"{where}: input={str(row['input'])[:80]!r}: expected a list of {{role, content}} messages")
    if row["arm"] not in ARMS:
      raise ValueError(f"{where}: arm={row['arm']!r}: not an arm of experiments/rag_loop/arms.py ({', '.join(ARMS)})")
    c = row["correct"]
    if not isinstance(c, dict) or set(c) != set(ARMS) or any(v not in (0, 1) for v in c.values()):
      raise ValueError(f"{where}: correct={str(c)[:80]!r}: expected {{arm: 0 or 1}} for the arms {', '.join(ARMS)}")
    rows.append(row)
  if not rows:
    raise ValueError(f"{path}: no rows")
  return rows


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--work", default="runs/experiments/rag_loop/work",
                  help="run.py's work folder, where the prompts are written (default: run.py's default --out's)")
  ap.add_argument("--results", default=None, help="run.py's results.json (default: beside --work)")
  ap.add_argument("--tokenizer", default="smollm2-135m-instruct")
  ap.add_argument("--embedder", default="all-MiniLM-L6-v2")
  ap.add_argument("--overwrite", action="store_true", help=f"allow replacing a {FILE} tracked by git")
  args = ap.parse_args(argv)
  output_folder_or_exit(pathlib.Path(args.work) / FILE, args.overwrite, "--work")
  rows = compute(args.work, args.results, args.tokenizer, args.embedder)
  write(pathlib.Path(args.work) / FILE, rows)
  print(f"{len(rows)} held-out questions -> {pathlib.Path(args.work) / FILE}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
