"""CLI: python -m fineflax.evals --a VARIANT --b VARIANT --data FILE [...] (see fineflax.evals), or several:
--variant SPEC (repeatable, the first is the baseline); SPEC is URL#MODEL, SOURCE[+ADAPTER_DIR] or the name of
a RAG variant of --rag-config, run in-process over --generator SOURCE[+ADAPTER_DIR] (fineflax.evals.rag_variants)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys

from fineflax.evals.harness import EvalDataError, load_eval_set, run_ab
from fineflax.evals.judge import openai_judge
from fineflax.evals.report import write_report
from fineflax.evals.variants import check_endpoint, check_spec, make_variant, parse_spec


def build_parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="python -m fineflax.evals", description=__doc__.splitlines()[0])
  ap.add_argument("--a", default=None, help="variant A: URL#MODEL or SOURCE[+ADAPTER_DIR]")
  ap.add_argument("--b", default=None, help="variant B: URL#MODEL or SOURCE[+ADAPTER_DIR]")
  ap.add_argument("--variant", action="append", default=[],
                  help="one of several variants (repeatable; instead of --a/--b): URL#MODEL, SOURCE[+ADAPTER] "
                       "or a RAG variant name of --rag-config")
  ap.add_argument("--rag-config", default=None, help="RAG variants, retrievers (fineflax.rag.spec JSON file)")
  ap.add_argument("--generator", default=None, help="SOURCE[+ADAPTER] that RAG variants without one generate with")
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
  ap.add_argument("--out", default="runs/eval_report", help="output folder (default runs/eval_report) (report.md, ab.png, results.json)")
  return ap


def check_before_loading(flagged, judge_url: str | None, judge_model: str | None) -> None:
  """Each (flag, variant spec)'s endpoint or files and the judge's endpoint, before any model loads:
  ValueError naming the flag, the value and the fault (`variants.check_spec`)."""
  for flag, spec in flagged:
    try:
      check_spec(spec)
    except (ValueError, FileNotFoundError) as e:
      raise ValueError(f"{flag} {spec}: {e}") from None
  if judge_url:
    try:
      check_endpoint(judge_url, judge_model)
    except ValueError as e:
      raise ValueError(f"--judge-url {judge_url} --judge-model {judge_model}: {e}") from None


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  if bool(args.judge_url) != bool(args.judge_model):
    print("error: --judge-url and --judge-model go together", file=sys.stderr)
    return 2
  if args.variant:
    return main_many(args, argv)
  if not (args.a and args.b):
    print("error: give --a and --b, or two or more --variant", file=sys.stderr)
    return 2
  try:
    for spec in (args.a, args.b):
      parse_spec(spec)
    rows = load_eval_set(args.data, args.limit or None)
    check_before_loading([("--a", args.a), ("--b", args.b)], args.judge_url, args.judge_model)
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


def main_many(args, argv) -> int:
  """Several variants: per-variant metrics, the judge against the first (see `harness.run_many`)."""
  from fineflax.evals.harness import run_many
  from fineflax.evals.report import write_many_report
  from fineflax.extras import require_retrievers
  from fineflax.rag.spec import RagConfigError, from_args
  try:
    if len(args.variant) < 2 or len(set(args.variant)) != len(args.variant):
      raise ValueError(f"--variant {args.variant}: give two or more distinct variants")
    rag = from_args(args.rag_config) if args.rag_config else None
    rag_names = [s for s in args.variant if rag is not None and s in rag.variants]
    for s in args.variant:
      if s not in rag_names:
        if not s.startswith(("http://", "https://")) and rag is not None and "/" not in s and "+" not in s \
            and s.endswith("_rag"):
          raise ValueError(f"--variant {s}: not a variant of --rag-config {args.rag_config} "
                           f"(variants: {', '.join(rag.variants)})")
        parse_spec(s)
    missing = [s for s in rag_names if not (rag.variants[s].generator or args.generator)]
    if missing:
      raise ValueError(f"RAG variants {missing} need a generator: --generator SOURCE[+ADAPTER]")
    if rag_names:  # the packages the in-process retrievers of the chosen RAG variants need
      used = {rag.variants[s].retriever for s in rag_names if rag.variants[s].retrieves}
      require_retrievers({n: spec for n, spec in rag.retrievers.items() if n in used},
                         f"--rag-config {args.rag_config}")
    rows = load_eval_set(args.data, args.limit or None)
    check_before_loading([("--variant", s) for s in args.variant if s not in rag_names]
                         + ([("--generator", args.generator)] if rag_names and args.generator else []),
                         args.judge_url, args.judge_model)
  except (ValueError, EvalDataError, RagConfigError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  kw = dict(max_tokens=args.max_tokens, temperature=args.temperature)
  built = {}
  if rag_names:
    from fineflax.evals.rag_variants import rag_variants
    built = rag_variants(rag, rag_names, args.generator, quant=args.local_quant, seed=args.seed, **kw)
  local = dict(quant=args.local_quant, seed=args.seed)
  variants = {s: built[s] if s in built else
              make_variant(s, **kw, **(local if parse_spec(s)["kind"] == "local" else {})) for s in args.variant}
  judge = openai_judge(args.judge_url, args.judge_model) if args.judge_url else None
  rewards = [r.strip() for r in args.rewards.split(",") if r.strip()]
  result = run_many(rows, variants, judge=judge, rewards=rewards, num_resamples=args.resamples, seed=args.seed)
  command = "python -m fineflax.evals " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
  specs = {s: (f"RAG {rag.variants[s].kind} over {rag.variants[s].generator or args.generator}" if s in built else s)
           for s in args.variant}
  path = write_many_report(args.out, result, specs=specs, data=args.data,
                           judge_desc=f"{args.judge_url}#{args.judge_model}" if judge else None, command=command)
  print(json.dumps(result["summary"], indent=2))
  print(f"report: {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
