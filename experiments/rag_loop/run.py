"""The RAG loop on CPU: RAG variants as arms, simulated users with a hidden correctness reward, contextual
routing against non-contextual routing and uniform routing; the interaction log and its training rows.

  python -m experiments.rag_loop.run [--out runs/experiments/rag_loop [--overwrite]] [--steps 3000] [--seeds 10]   (~3 min CPU)

1. The knowledge base (`fineflax/rag/kb.py`: keyword / paraphrase / multi-hop questions) and its arms (`arms.py`: no_rag,
   bm25_rag, dense_rag, hybrid_rag, agentic_rag), each run for real on every question: correctness =
   retrieval recall of the gold passage (no generator in this CPU run). The measured per-category rates
   are the arms' success rates.
2. Simulated users: each request draws a category (uniform) and a training question of it; the router
   picks an arm and the user's hidden reward is that arm's correctness on that question. Routers
   (`fineflax.serve.router.ContextualRouter`, Thompson and UCB1): contextual (statistics per category),
   non-contextual (overall statistics), and uniform. Cumulative expected regret = sum_t max_a rate(c_t, a)
   - rate(c_t, a_t); mean and 95% t-interval over --seeds; share of each category's last 200 requests
   sent to its best arm.
3. The first contextual Thompson run is logged as the server logs (`fineflax.serve.feedback.FeedbackLog`:
   question, category, variant, passages, input messages, answer, reward; the answer of a correct arm is the
   gold answer, of a wrong one "unknown": a stand-in generator), and `fineflax.data.from_feedback` turns it
   into SFT rows with context, without context (--no-context) and preference pairs across variants: the
   data of the student step (`student.py`, GPU).
Writes results.json, regret.png, RESULTS.md (its block; the student's block, `new_arm.py`, stays) and work/
(corpus, questions, log, SFT rows).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

from benchmarks._results import write_section
from experiments.rag_loop.arms import ARMS, build_engines, measure
from fineflax.rag.kb import CATEGORIES, make_kb
from fineflax.extras import MissingExtra, require, search_engine_modules
from fineflax.io import atomic_write_json, atomic_write_text
from fineflax.stats import t_interval
from fineflax.runs import add_output_args, output_folder_or_exit

HERE = pathlib.Path(__file__).resolve().parent
ROUTERS = ("contextual", "non_contextual", "uniform")


def simulate(router_kind, kind, correct, pool, seed, steps, log=None, questions=None, runs=None, *,
             arms=tuple(ARMS), router=None, rng=None):
  """One run of `steps` simulated requests: (chosen arm indices [steps], categories [steps], rewards [steps]).

  correct [questions, len(arms)]: arm a's 0/1 correctness on each question; pool[c]: the indices of the
  questions users of category c ask (uniform). router: a router to continue (anything with choose(category)
  / update(arm, reward, category)); default a fresh ContextualRouter of `router_kind` over `arms` seeded by
  `seed` (None for "uniform"). rng: the users' generator to continue (default seeded by 1000 + seed).
  log / questions / runs: the run logged as the server logs it (FeedbackLog; run.py's first run)."""
  from fineflax.serve.router import ContextualRouter
  arms = list(arms)
  rng = np.random.default_rng(1000 + seed) if rng is None else rng
  if router is None and router_kind != "uniform":
    router = ContextualRouter(arms, kind, seed=seed, contextual=router_kind == "contextual")
  chosen, cats, rewards = np.zeros(steps, int), np.zeros(steps, int), np.zeros(steps)
  for t in range(steps):
    c = int(rng.integers(len(CATEGORIES)))
    qi = int(rng.choice(pool[c]))
    a = int(rng.integers(len(arms))) if router is None else arms.index(router.choose(CATEGORIES[c]))
    r = float(correct[qi, a])
    if router is not None:
      router.update(arms[a], r, CATEGORIES[c])
    chosen[t], cats[t], rewards[t] = a, c, r
    if log is not None:
      q, run = questions[qi], runs[questions[qi]["id"]][arms[a]]
      rid = f"sim-{t}"
      log.add_responses([{"id": rid, "created": float(t), "variant": arms[a], "request": {"model": "auto"},
                          "messages": [{"role": "user", "content": q["question"]}],
                          "answer": q["answer"] if r else "unknown", "settings": {}, "question": q["question"],
                          "category": CATEGORIES[c], "passages": run["passages"], "input": run["input"]}])
      log.add_feedback(rid, r)
  return chosen, cats, rewards


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_output_args(ap, "rag_loop")
  ap.add_argument("--steps", type=int, default=3000)
  ap.add_argument("--seeds", type=int, default=10)
  ap.add_argument("--per-category", type=int, default=120, help="questions per category")
  ap.add_argument("--last", type=int, default=200, help="window of the share-to-best metric, per category")
  ap.add_argument("--embedder", default="all-MiniLM-L6-v2")
  args = ap.parse_args(argv)
  try:  # before anything is written or loaded
    require("python -m experiments.rag_loop.run", search_engine_modules("hybrid", args.embedder))
  except MissingExtra as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  t0 = time.time()
  out = pathlib.Path(output_folder_or_exit(args.out, args.overwrite))
  work = out / "work"
  work.mkdir(parents=True, exist_ok=True)
  docs, questions = make_kb(args.per_category)
  atomic_write_text(work / "corpus.jsonl", "".join(json.dumps(d) + "\n" for d in docs))
  atomic_write_text(work / "questions.jsonl", "".join(json.dumps(q) + "\n" for q in questions))

  # 1. the arms, measured
  from fineflax.models import load_tokenizer
  print(f"1/3 measuring {len(ARMS)} arms on {len(questions)} questions (output: {out})", flush=True)
  engines = build_engines(docs, args.embedder)
  runs, correct = measure(questions, engines, load_tokenizer("smollm2-135m-instruct"))
  arms = list(ARMS)
  cat_of = np.array([CATEGORIES.index(q["category"]) for q in questions])
  train = np.array([q["split"] == "train" for q in questions])
  train_idx = [np.flatnonzero((cat_of == c) & train) for c in range(len(CATEGORIES))]
  rates = np.array([correct[train_idx[c]].mean(0) for c in range(len(CATEGORIES))])  # [category, arm]
  all_rates = np.array([correct[cat_of == c].mean(0) for c in range(len(CATEGORIES))])
  best = rates.argmax(1)

  # 2. routing
  import logging
  logging.getLogger("fineflax.serve").setLevel(logging.ERROR)
  from fineflax.serve.feedback import FeedbackLog
  db = work / "interactions.sqlite"
  for p in work.glob("interactions.sqlite*"):
    p.unlink()
  results = {"arms": arms, "categories": list(CATEGORIES), "steps": args.steps, "seeds": args.seeds,
             "rates_train": {c: dict(zip(arms, rates[i].round(4).tolist())) for i, c in enumerate(CATEGORIES)},
             "rates_all": {c: dict(zip(arms, all_rates[i].round(4).tolist())) for i, c in enumerate(CATEGORIES)},
             "questions": {c: {"train": int(len(train_idx[i])), "all": int((cat_of == i).sum())}
                           for i, c in enumerate(CATEGORIES)},
             "best": {c: arms[best[i]] for i, c in enumerate(CATEGORIES)}, "routing": {}}
  curves = {}
  for kind in ("thompson", "ucb1"):
    for rk in ROUTERS:
      if rk == "uniform" and kind == "ucb1":
        continue
      name = "uniform" if rk == "uniform" else f"{rk}_{kind}"
      print(f"2/3 routing {name}: {args.seeds} seeds x {args.steps} requests ({time.time() - t0:.0f} s)", flush=True)
      finals, shares, curve = [], [], []
      for seed in range(args.seeds):
        log = FeedbackLog(db, synchronous="NORMAL", reward_range=(0, 1)) if (
            seed == 0 and name == "contextual_thompson") else None
        chosen, cats, _ = simulate(rk, kind, correct, train_idx, seed, args.steps, log, questions, runs)
        if log is not None:
          log.close()
        regret = np.cumsum(rates[cats, best[cats]] - rates[cats, chosen])
        curve.append(regret)
        finals.append(float(regret[-1]))
        shares.append({c: float(np.mean(chosen[cats == i][-args.last:] == best[i])) for i, c in enumerate(CATEGORIES)})
      mean, lo, hi = t_interval(finals)
      results["routing"][name] = {
          "final_regret": {"mean": mean, "ci95": [lo, hi], "per_seed": finals},
          "share_last_to_best": {c: {"mean": float(np.mean([s[c] for s in shares])),
                                     "min": float(np.min([s[c] for s in shares]))} for c in CATEGORIES}}
      curves[name] = np.array(curve)
  for kind in ("thompson", "ucb1"):
    ctx, non = (results["routing"][f"{r}_{kind}"]["final_regret"]["mean"] for r in ("contextual", "non_contextual"))
    results["routing"][f"ratio_{kind}"] = ctx / non

  # 3. the log -> training rows
  print("3/3 the log -> training rows, the plot and RESULTS.md", flush=True)
  from fineflax.data.from_feedback import convert
  counts = {"context": convert(db, work / "sft_context.jsonl", min_reward=1.0, pairs_out=work / "pairs.jsonl"),
            "no_context": convert(db, work / "sft_no_context.jsonl", min_reward=1.0, context=False)}
  results["log"] = {"path": str(db.relative_to(out)), "from_feedback": counts}
  results["seconds"] = round(time.time() - t0, 1)
  atomic_write_json(out / "results.json", results, indent=2)
  plot(curves, out / "regret.png", args)
  write_section("rag_loop_run", report(results, args), out / "RESULTS.md", header="")
  print(json.dumps({k: results["routing"][k] for k in ("ratio_thompson", "ratio_ucb1")}))


def plot(curves, path, args):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.2))
  t = np.arange(1, args.steps + 1)
  for name, c in curves.items():
    ax.plot(t, c.mean(0), label=name.replace("_", " "))
    ax.fill_between(t, np.percentile(c, 10, 0), np.percentile(c, 90, 0), alpha=0.15)
  ax.set_xlabel("requests")
  ax.set_ylabel("cumulative expected regret")
  ax.set_title(f"RAG arms routed per category vs overall ({args.seeds} seeds; band 10-90th pct)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def rates_table(title: str, rates: dict, counts: dict, arms) -> list[str]:
  """Markdown lines of {category: {arm: rate}}, one row per category ("category (count)"), its best in bold."""
  lines = [f"| {title} | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
  for c, row in rates.items():
    top = max(row[a] for a in arms)
    lines.append(f"| {c} ({counts[c]}) | " + " | ".join(
        f"**{row[a]:.3f}**" if row[a] == top else f"{row[a]:.3f}" for a in arms) + " |")
  return lines


def report(r, args) -> str:
  arms, cats = r["arms"], r["categories"]
  lines = ["# RAG loop: RAG variants as arms, contextual routing (CPU simulation)", "",
           "Command: `python -m experiments.rag_loop.run" + (f" --steps {args.steps} --seeds {args.seeds}"
                                                            if (args.steps, args.seeds) != (3000, 10) else "")
           + f"` ({r['seconds']:.0f} s on 2 shared CPU cores). Code: `experiments/rag_loop/` (arms.py, run.py) and "
           "`fineflax/rag/kb.py`.", "",
           "## Arms, measured on the knowledge base", "",
           "Each arm is a `fineflax.rag` variant run for real over `retrieval/` engines of the KB corpus "
           "(dense = all-MiniLM-L6-v2; hybrid = BM25 + dense RRF, **no cross-encoder**: no trained checkpoint "
           "is available offline). **No generator runs here: an arm's correctness on a question is retrieval "
           "recall of the gold passage** (is it among the passages put in front of the generator). The agentic "
           "arm runs the Search-R1 loop (`run_rollouts`) with a rule reader in place of the LLM (search the "
           "question; if a passage says \"born in <City>\", search the city; answer).", "",
           *rates_table("category (train questions)", r["rates_train"], {c: r["questions"][c]["train"] for c in cats},
                        arms)]
  lines += ["", "## Routing: simulated users, hidden correctness reward", "",
            f"{r['steps']} requests per run, category uniform, question uniform among the category's training "
            "questions, reward = the chosen arm's correctness on it. Regret = cumulative expected regret "
            f"(measured rates); mean and 95% t-interval over {r['seeds']} seeds. Share = fraction of each "
            f"category's last {args.last} requests sent to its best arm (mean / min over seeds).", "",
            "| router | final regret (95% CI) | " + " | ".join(f"share {c}" for c in cats) + " |",
            "|---|---|" + "---|" * len(cats)]
  for name, s in r["routing"].items():
    if name.startswith("ratio"):
      continue
    f = s["final_regret"]
    lines.append(f"| {name} | {f['mean']:.1f} ({f['ci95'][0]:.1f}, {f['ci95'][1]:.1f}) | " + " | ".join(
        f"{s['share_last_to_best'][c]['mean']:.3f} / {s['share_last_to_best'][c]['min']:.3f}" for c in cats) + " |")
  ok_share = all(r["routing"]["contextual_thompson"]["share_last_to_best"][c]["min"] >= 0.9 for c in cats)
  lines += ["", "Targets: contextual regret <= 0.5x non-contextual: "
            f"Thompson {r['routing']['ratio_thompson']:.3f}x, UCB1 {r['routing']['ratio_ucb1']:.3f}x; share of "
            f"each category's last {args.last} to its best arm >= 0.9 (contextual Thompson, every seed): "
            f"{'met' if ok_share else 'NOT met'}.", "", "![regret](regret.png)", "",
            "## Logs that train", "",
            "The first contextual Thompson run is logged through `fineflax.serve.feedback.FeedbackLog` (question, "
            "category, variant, passages, input messages, answer, reward; a correct arm's answer is the gold "
            "answer, a wrong one's \"unknown\": a stand-in generator), then `python -m fineflax.data.from_feedback` "
            f"gives: with context {r['log']['from_feedback']['context']}, without context "
            f"{r['log']['from_feedback']['no_context']} (work/sft_context.jsonl, work/sft_no_context.jsonl, "
            "work/pairs.jsonl). The student step (SFT on these rows with vs without context, held-out questions) "
            "is `python -m experiments.rag_loop.student` (GPU; see its docstring)."]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
