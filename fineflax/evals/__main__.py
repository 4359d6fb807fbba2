"""CLI: python -m fineflax.evals --a VARIANT --b VARIANT --data FILE [...] (see fineflax.evals)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys

from fineflax.evals.harness import EvalDataError, load_eval_set, run_ab
from fineflax.evals.judge import openai_judge
from fineflax.evals.report import write_report
from fineflax.evals.variants import make_variant, parse_spec


def build_parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="python -m fineflax.evals", description=__doc__.splitlines()[0])
  ap.add_argument("--a", required=True, help="variant A: URL#MODEL or SOURCE[+ADAPTER_DIR]")
  ap.add_argument("--b", required=True, help="variant B: URL#MODEL or SOURCE[+ADAPTER_DIR]")
  ap.add_argument("--data", required=True, help="eval set (JSONL/JSON: messages, prompt or question rows)")
  ap.add_argument("--judge-url", default=None, help="OpenAI-compatible base URL of the judge (…/v1)")
  ap.add_argument("--judge-model", default=None, help="the judge's model name")
  ap.add_argument("--rewards", default="", help="comma-separated registry rewards to score (e.g. math_last_number)")
  ap.add_argument("--max-tokens", type=int, default=256, help="answer length limit")
  ap.add_argument("--temperature", type=float, default=0.0, help="answer sampling temperature (0 = greedy)")
  ap.add_argument("--local-quant", default="none", choices=("none", "nf4", "int8"), help="local variants' base")
  ap.add_argument("--limit", type=int, default=0, help="first N examples only (0 = all)")
  ap.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples")
  ap.add_argument("--seed", type=int, default=0, help="bootstrap and sampling seed")
  ap.add_argument("--out", default="eval_report", help="output folder (report.md, ab.png, results.json)")
  return ap


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  if bool(args.judge_url) != bool(args.judge_model):
    print("error: --judge-url and --judge-model go together", file=sys.stderr)
    return 2
  try:
    for spec in (args.a, args.b):
      parse_spec(spec)
    rows = load_eval_set(args.data, args.limit or None)
  except (ValueError, EvalDataError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  kw = dict(max_tokens=args.max_tokens, temperature=args.temperature)
  local = dict(quant=args.local_quant, seed=args.seed)
  variants = [make_variant(s, **kw, **(local if parse_spec(s)["kind"] == "local" else {})) for s in (args.a, args.b)]
  judge = openai_judge(args.judge_url, args.judge_model) if args.judge_url else None
  rewards = [r.strip() for r in args.rewards.split(",") if r.strip()]
  result = run_ab(rows, *variants, judge=judge, rewards=rewards, num_resamples=args.resamples, seed=args.seed)
  command = "python -m fineflax.evals " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
  path = write_report(args.out, result, spec_a=args.a, spec_b=args.b, data=args.data,
                      judge_desc=f"{args.judge_url}#{args.judge_model}" if judge else None, command=command)
  print(json.dumps(result["summary"], indent=2))
  print(f"report: {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
