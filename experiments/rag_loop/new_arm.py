"""The student as a new arm of the RAG loop: after student.py, the routers go on with the student added.

  python -m experiments.rag_loop.new_arm [--student experiments/rag_loop/student/student.json]
      [--heldout experiments/rag_loop/work/heldout_prompts.jsonl] [--out experiments/rag_loop]
      [--results-md experiments/rag_loop/RESULTS.md | ""] [--before 3000] [--after 3000] [--seeds 10]   (CPU, ~1 min)

Arm "student": in category c, the retrieval of c's best arm (the held-out row's "arm") with the student SFT'd on
the rows WITH context as its generator; served as the variant student_<arm> (student.py's student_rag.json).
Its correctness on a held-out question is student.py's exact match of its answer ("per_question"
"em_context"); every other arm's is recall of the gold passage (the held-out row's "correct": run.py's stand-in
reader, right iff the gold passage is in its context, so a real reader over that arm's passages does no better).
Questions: the held-out ones (heldout.py), the only ones the student answered; its training rows came from the
training questions, so a reward there would measure recall of the training rows, not the arm.

Each run uses run.py's `simulate` (the same users and routers): --before requests over the five arms, then the
server restarts with the student declared, so a fresh `ContextualRouter` over six arms is loaded with the first
phase's statistics (`reward_sums`, what `python -m fineflax.serve` reads from its log at start; the student
has none and is tried first), then --after requests. Per router, mean and 95% t-interval over seeds of: the
share of each category's requests after the join sent to the student (all of them, and the last --last), the
cumulative expected regret after the join against the best of the six arms (rates: held-out means), and the
whole run's (before the join: against the best of the five).
Writes new_arm.json and new_arm.png in --out and the block "student_arm" of --results-md.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

from benchmarks._results import write_section
from experiments.rag_loop import heldout
from experiments.rag_loop.arms import ARMS
from fineflax.rag.kb import CATEGORIES
from experiments.rag_loop.run import rates_table, simulate
from fineflax.io import atomic_write_json
from fineflax.stats import t_interval
from fineflax.runs import add_output_args, output_folder_or_exit

HERE = pathlib.Path(__file__).resolve().parent
STUDENT = "student"
ROUTERS = [(r, k) for k in ("thompson", "ucb1") for r in ("contextual", "non_contextual")]


def reward_sums(arms, chosen, cats, rewards) -> dict:
  """{(arm, category): {"n", "sum", "sum_sq", "binary"}} of a run, keyed and valued as
  `FeedbackLog.reward_sums(by_category=True)` (pairs without a request left out)."""
  out = {}
  for a, arm in enumerate(arms):
    for c, cat in enumerate(CATEGORIES):
      r = rewards[(chosen == a) & (cats == c)]
      if len(r):
        out[(arm, cat)] = {"n": int(len(r)), "sum": float(r.sum()), "sum_sq": float((r * r).sum()),
                           "binary": bool(np.isin(r, (0.0, 1.0)).all())}
  return out


def student_matrix(rows: list[dict], student: dict):
  """(correct [questions, arms + student], pool per category, kept rows): the held-out rows the student
  answered, in order; a student answer to a question that is not held out raises ValueError."""
  em = {p["id"]: float(p["em_context"]) for p in student["per_question"]}
  unknown = sorted(set(em) - {r["id"] for r in rows})
  if unknown:
    raise ValueError(f"student.json answers {unknown[:3]} which are not held-out questions of the held-out file")
  kept = [r for r in rows if r["id"] in em]
  correct = np.array([[r["correct"][a] for a in ARMS] + [em[r["id"]]] for r in kept], float)
  cat = np.array([CATEGORIES.index(r["category"]) for r in kept])
  pool = [np.flatnonzero(cat == c) for c in range(len(CATEGORIES))]
  missing = [CATEGORIES[c] for c, p in enumerate(pool) if not len(p)]
  if missing:
    raise ValueError(f"student.json answers no held-out question of {missing}")
  return correct, pool, kept


def run_with_join(router_kind, kind, correct, pool, seed, before, after):
  """(chosen [before + after], categories, rewards): `simulate` over the arms, then over arms + student with a
  fresh router loaded with the first phase's `reward_sums` (the module docstring's restart)."""
  from fineflax.serve.router import ContextualRouter
  arms = list(ARMS)
  users = np.random.default_rng(1000 + seed)
  a = simulate(router_kind, kind, correct[:, :len(arms)], pool, seed, before, arms=arms, rng=users)
  router = ContextualRouter(arms + [STUDENT], kind, seed=10_000 + seed,
                            contextual=router_kind == "contextual").load(reward_sums(arms, *a))
  b = simulate(router_kind, kind, correct, pool, seed, after, arms=arms + [STUDENT], router=router, rng=users)
  return tuple(np.concatenate([x, y]) for x, y in zip(a, b))


def evaluate(correct, pool, before, after, seeds, last) -> dict:
  """Per router (module docstring) plus the held-out rates {category: {arm: rate}} and the curves."""
  rates = np.array([correct[p].mean(0) for p in pool])  # [category, arm]
  n = len(ARMS)
  best = np.concatenate([np.repeat(rates[:, :n].max(1, keepdims=True), before, 1),
                         np.repeat(rates.max(1, keepdims=True), after, 1)], 1)  # [category, t]
  out, curves = {}, {}
  for rk, kind in ROUTERS:
    name = f"{rk}_{kind}"
    after_regret, total, share_all, share_last, curve = [], [], [], [], []
    for seed in range(seeds):
      chosen, cats, _ = run_with_join(rk, kind, correct, pool, seed, before, after)
      regret = np.cumsum(best[cats, np.arange(before + after)] - rates[cats, chosen])
      curve.append(regret)
      total.append(float(regret[-1]))
      after_regret.append(float(regret[-1] - (regret[before - 1] if before else 0.0)))
      joined = [chosen[before:][cats[before:] == c] == n for c in range(len(CATEGORIES))]
      share_all.append([float(j.mean()) if len(j) else 0.0 for j in joined])
      share_last.append([float(j[-last:].mean()) if len(j) else 0.0 for j in joined])
    ci = lambda v: dict(zip(("mean", "lo", "hi"), t_interval(v)))
    out[name] = {"regret_after_join": ci(after_regret), "regret_total": ci(total),
                 "share_student": {c: {"all": float(np.mean([s[i] for s in share_all])),
                                       "last": float(np.mean([s[i] for s in share_last])),
                                       "last_min": float(np.min([s[i] for s in share_last]))}
                                   for i, c in enumerate(CATEGORIES)}}
    curves[name] = np.array(curve)
  arms = list(ARMS) + [STUDENT]
  return {"rates_heldout": {c: dict(zip(arms, rates[i].round(4).tolist())) for i, c in enumerate(CATEGORIES)},
          "best_after_join": {c: arms[int(rates[i].argmax())] for i, c in enumerate(CATEGORIES)},
          "questions": {c: int(len(p)) for c, p in zip(CATEGORIES, pool)}, "routing": out}, curves


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--student", default=str(HERE / "student" / "student.json"), help="student.py's student.json")
  ap.add_argument("--heldout", default=str(HERE / "work" / heldout.FILE))
  add_output_args(ap, "rag_loop_new_arm")
  ap.add_argument("--results-md", default=None, help='markdown file of the block (default: --out/RESULTS.md; "": none)')
  ap.add_argument("--before", type=int, default=3000, help="requests before the student joins")
  ap.add_argument("--after", type=int, default=3000, help="requests after it joins")
  ap.add_argument("--seeds", type=int, default=10)
  ap.add_argument("--last", type=int, default=200, help="window of the last-requests share, per category")
  args = ap.parse_args(argv)
  output_folder_or_exit(args.out, args.overwrite)
  t0, out = time.time(), pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  student = json.loads(pathlib.Path(args.student).read_text())
  correct, pool, _ = student_matrix(heldout.load(args.heldout), student)
  result, curves = evaluate(correct, pool, args.before, args.after, args.seeds, args.last)
  result = {"student": {k: student.get(k) for k in ("model", "steps", "questions", "em")},
            "student_json": str(args.student), "before": args.before, "after": args.after, "seeds": args.seeds,
            "last": args.last, **result, "seconds": round(time.time() - t0, 1)}
  atomic_write_json(out / "new_arm.json", result, indent=2)
  plot(curves, result, out / "new_arm.png")
  md = args.results_md if args.results_md is not None else str(out / "RESULTS.md")
  if md:
    write_section("student_arm", report(result, pathlib.Path(md).parent, out / "new_arm.png"), pathlib.Path(md),
                  header="")
  print(json.dumps({n: {c: round(s["share_student"][c]["all"], 3) for c in CATEGORIES}
                    for n, s in result["routing"].items()}))
  return result


def plot(curves, r, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.2))
  t = np.arange(1, r["before"] + r["after"] + 1)
  for name, c in curves.items():
    ax.plot(t, c.mean(0), label=name.replace("_", " "))
    ax.fill_between(t, np.percentile(c, 10, 0), np.percentile(c, 90, 0), alpha=0.15)
  ax.axvline(r["before"], color="k", ls=":", lw=1)
  ax.text(r["before"], ax.get_ylim()[1] * 0.95, " student joins", fontsize=8, va="top")
  ax.set_xlabel("requests (held-out questions)")
  ax.set_ylabel("cumulative expected regret")
  ax.set_title(f"The student as a new arm ({r['seeds']} seeds; band 10-90th pct)", fontsize=10)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def report(r, md_dir: pathlib.Path, png: pathlib.Path) -> str:
  arms, cats, s = list(ARMS) + [STUDENT], CATEGORIES, r["student"]
  try:
    rel = png.resolve().relative_to(md_dir.resolve())
  except ValueError:
    rel = png
  lines = ["## The student as a new arm", "",
           f"Command: `python -m experiments.rag_loop.new_arm --student {r['student_json']}` (CPU, {r['seconds']:.0f} s), "
           f"from student.py's answers: model `{s['model']}`, {s['steps']} SFT steps, {s['questions']} held-out "
           f"questions answered (EM with context {s['em']['context']:.3f}). Arm \"student\" = the retrieval of the "
           "category's best arm + the student SFT'd on the logged rows with context (served as variant "
           "`student_<arm>`: student.py writes `student_rag.json` and the `python -m fineflax.serve` line). "
           "Its reward = exact match of its answer; the other arms' = recall of the gold passage (run.py's stand-in "
           "reader: no real reader over their passages does better). Held-out questions only (the student's own "
           "training rows came from the training questions).", "",
           *rates_table("category (held-out questions)", r["rates_heldout"], r["questions"], arms)]
  lines += ["", f"{r['before']} requests over the five arms, then the server restarts with the student declared "
            f"(the router reloads the logged statistics; the student starts at none) and {r['after']} more; users "
            f"and routers as in run.py. Mean and 95% t-interval over {r['seeds']} seeds. Share = fraction of "
            f"the category's requests after the join sent to the student (all / last {r['last']}).", "",
            "| router | regret after the join (95% CI) | whole run | " + " | ".join(f"share {c}" for c in cats) + " |",
            "|---|---|---|" + "---|" * len(cats)]
  for name, x in r["routing"].items():
    a, t = x["regret_after_join"], x["regret_total"]
    lines.append(f"| {name} | {a['mean']:.1f} ({a['lo']:.1f}, {a['hi']:.1f}) | {t['mean']:.1f} | " + " | ".join(
        f"{x['share_student'][c]['all']:.3f} / {x['share_student'][c]['last']:.3f}" for c in cats) + " |")
  lines += ["", f"![student as a new arm]({rel})"]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
