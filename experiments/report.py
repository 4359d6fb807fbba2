"""The generated result blocks of README.md and experiments/*/RESULTS.md, made from the results.json files.

  python -m experiments.report            # rewrite every block from the results files
  python -m experiments.report --check    # exit 1, naming each block that differs from what they give

A block is the text between `<!-- report:begin NAME -->` and `<!-- report:end NAME -->` in its file; the
prose around it is written by hand and holds no result number of its own. Every number in a block comes
from a results.json written by experiments/compare.py (or a run.py on top of it): per method and seed
the evaluation records, per step the training metrics, and per seed the baselines without a model
(`no_model_baselines`: the most frequent training answer; Search-R1's prior of the training facts) and,
for Search-R1, the base model's direct / RAG answers (`baselines`).

The final step of a comparison is the last evaluation step that every seed of every compared method
reached (a method's `offset` shifts its steps: sft_rl's 50 SFT steps come first). Cells: mean ± 95% CI
(Student t over seeds) with the per-seed values; comparisons are paired by seed: the mean difference,
the seeds where the first method is ahead, the paired t-test p and the exact sign-flip p
(`fineflax.runs.paired_test`; with 4 seeds it cannot go below 0.125). "base model" is each seed's
evaluation at step 0, before any update. Where an experiment keeps the results of its runs from before
issue 35's fixes (`previous`), the block ends with both side by side: per method and baseline, the
metric at each file's own final step, and the change of the means (now - before; seeds are not paired
across the two files).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

from fineflax.io import atomic_write_text
from fineflax.runs import mean_ci95, paired_test


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One results.json and how to tabulate it: methods (name -> label), metrics (key -> column), the
  comparisons (a, b) tested as a - b on the `compared` metrics (default: all), and the metric the headline
  and the baseline check use."""
  name: str
  results: str
  title: str
  methods: dict
  metrics: dict
  comparisons: tuple
  main_metric: str
  offset: dict = dataclasses.field(default_factory=dict)
  model_baselines: dict = dataclasses.field(default_factory=dict)  # results["baselines"] key -> label
  compared: tuple = ()
  previous: str = ""  # the same experiment's results.json from before issue 35's fixes (the 2026-11-26 runs)


NO_MODEL = {"constant": "constant answer (most frequent training answer)",
            "prior": "prior of the training facts (most frequent training answer of the question's kind)"}
SHORT = {"base model (step 0)": "base model", NO_MODEL["constant"]: "constant answer", NO_MODEL["prior"]: "prior",
         "base model, direct answer": "direct", "base model, RAG (top-3, retrieve once)": "RAG",
         "base model, RAG with the oracle's passages": "RAG with oracle passages"}
ARITH = {"eval_accuracy": "held-out acc"}
LUFFY_SETS = {"eval_accuracy": "2-3 ops acc", "eval_pass_at_8": "2-3 ops pass@8", "eval_ood_ops_accuracy": "4-5 ops acc",
              "eval_ood_phrasing_accuracy": "second wording acc", "eval_completion_length": "greedy length",
              "eval_sample_entropy": "T=0.7 sample entropy"}
SEARCH = {"eval_em": "EM", "eval_em_1hop": "EM single-hop", "eval_em_2hop": "EM two-hop",
          "eval_searches": "searches / question"}
SEARCH_BASE = {"direct": "base model, direct answer", "rag": "base model, RAG (top-3, retrieve once)",
               "oracle_rag": "base model, RAG with the oracle's passages"}

EXPERIMENTS = {e.name: e for e in (
    Experiment("luffy", "experiments/luffy/results.json", "LUFFY's Table, 2-3 op arithmetic",
               {"rl": "on-policy RL", "sft": "SFT on the traces", "sft_rl": "SFT then RL", "luffy": "LUFFY",
                "luffy_noshape": "LUFFY without shaping"}, LUFFY_SETS,
               (("luffy", "rl"), ("luffy", "luffy_noshape"), ("luffy", "sft"), ("luffy", "sft_rl"), ("sft", "sft_rl")),
               "eval_accuracy", offset={"sft_rl": 50}, compared=tuple(list(LUFFY_SETS)[:4])),
    Experiment("exgrpo", "experiments/exgrpo/results.json", "ExGRPO vs GRPO, 1-2 op arithmetic",
               {"grpo": "GRPO", "exgrpo": "ExGRPO"}, ARITH, (("exgrpo", "grpo"),), "eval_accuracy",
               previous="experiments/exgrpo/results_before_issue35.json"),
    Experiment("grpo_arith", "experiments/exgrpo/results.json", "GRPO (grpo_arith defaults), 1-2 op arithmetic",
               {"grpo": "GRPO"}, ARITH, (), "eval_accuracy",
               previous="experiments/exgrpo/results_before_issue35.json"),
    Experiment("search_r1_masking", "experiments/search_r1_masking/results.json",
               "Search-R1 info-token masking", {"masked": "masked", "unmasked": "unmasked"}, SEARCH,
               (("masked", "unmasked"),), "eval_em",
               previous="experiments/search_r1_masking/results_before_issue35.json"),
    Experiment("search_r1", "experiments/search_r1/results.json", "Search-R1 alone vs combined (LUFFY-guided)",
               {"search_r1": "Search-R1 alone (GRPO)", "combined": "combined (LUFFY-guided)"}, SEARCH,
               (("combined", "search_r1"),), "eval_em_2hop", model_baselines=SEARCH_BASE,
               previous="experiments/search_r1/results_before_issue35.json"),
)}


def num(x: float) -> str:
  """3 decimals; 1 for values of 10 or more (lengths)."""
  return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3f}"


def fmt(values) -> str:
  """mean ± 95% CI of a list (just the value for one)."""
  if not values:
    return "-"
  m, ci = mean_ci95(values)
  return f"{num(m)} ± {num(ci) if abs(m) < 10 else f'{ci:.1f}'}" if len(values) > 1 else num(m)


def per_seed(values: dict) -> str:
  return " / ".join(num(v) for v in values.values())


def pvalue(p: float) -> str:
  return "-" if p != p else f"{p:.2f}" if p >= 0.01 else f"{p:.0e}"


class Data:
  """The values of one experiment's results.json: per method, per seed, the evaluation records."""

  def __init__(self, exp: Experiment):
    self.exp = exp
    self.res = json.loads((ROOT / exp.results).read_text())
    self.methods = [m for m in exp.methods if m in self.res["runs"]]
    self.evals = {m: {s: {e["step"]: e for e in run["evals"]} for s, run in self.res["runs"][m].items()}
                  for m in self.methods}
    self.seeds = sorted({s for m in self.methods for s in self.evals[m]}, key=int)

  def final_step(self, methods) -> int | None:
    """The last step (before offsets) that every seed of every method in `methods` evaluated."""
    common = None
    for m in methods:
      for steps in self.evals[m].values():
        own = {s - self.exp.offset.get(m, 0) for s in steps}
        common = own if common is None else common & own
    return max(common) if common else None

  def at(self, method: str, step: int, metric: str) -> dict:
    """{seed: value} of `metric` at `step` (+ the method's offset), over the seeds that have it."""
    s = step + self.exp.offset.get(method, 0)
    return {seed: ev[s][metric] for seed, ev in self.evals[method].items() if s in ev and metric in ev[s]}

  def baselines(self, metric: str) -> dict[str, dict]:
    """label -> {seed: value}: the base model at step 0, the base model with retrieval (Search-R1), the
    no-model baselines."""
    out = {}
    base = {seed: ev[0][metric] for seed, ev in self.evals[self.methods[0]].items() if 0 in ev and metric in ev[0]}
    if base:
      out["base model (step 0)"] = base
    for key, label in self.exp.model_baselines.items():
      short = metric.removeprefix("eval_")
      vals = {s: b[key][short] for s, b in self.res.get("baselines", {}).items() if short in b.get(key, {})}
      if vals:
        out[label] = vals
    for key, label in NO_MODEL.items():
      vals = {s: b[key][metric] for s, b in self.res.get("no_model_baselines", {}).items()
              if metric in b.get(key, {})}
      if vals:
        out[label] = vals
    return out


def table(d: Data, step: int) -> list[str]:
  """Baseline rows, then one row per method at the final step: mean ± CI and the per-seed values."""
  cols = d.exp.metrics
  lines = ["| | " + " | ".join(cols.values()) + " |", "|---|" + "---|" * len(cols)]
  labels = list(dict.fromkeys(label for m in cols for label in d.baselines(m)))
  for label in labels:
    cells = [d.baselines(m).get(label, {}) for m in cols]
    lines.append(f"| {label} | " + " | ".join(fmt(list(c.values())) for c in cells) + " |")
  for m in d.methods:
    at = f"step {step + d.exp.offset.get(m, 0)}"
    cells = [d.at(m, step, c) for c in cols]
    lines.append(f"| {d.exp.methods[m]} ({at}) | " + " | ".join(
        f"{fmt(list(c.values()))} ({per_seed(c)})" if c else "-" for c in cells) + " |")
  return lines


def above_baselines(d: Data, step: int) -> str:
  """Per method: the seeds whose main metric beats every baseline of the same seed."""
  metric, base = d.exp.main_metric, d.baselines(d.exp.main_metric)
  parts = []
  for m in d.methods:
    vals = d.at(m, step, metric)
    beats = sum(all(v > b[s] for b in base.values() if s in b) for s, v in vals.items())
    parts.append(f"{d.exp.methods[m]} {beats} of {len(vals)}")
  return (f"Seeds whose {d.exp.metrics[metric]} beats every baseline of the same seed: " + "; ".join(parts)
          if base else "No baseline in the results file.")


def comparisons(d: Data, step: int) -> list[str]:
  lines = ["| comparison | metric | mean difference | per seed | ahead in | paired t p | sign-flip p |",
           "|---|---|---|---|---|---|---|"]
  rows = 0
  for a, b in d.exp.comparisons:
    if a not in d.methods or b not in d.methods:
      continue
    for metric in d.exp.compared or d.exp.metrics:
      label = d.exp.metrics[metric]
      t = paired_test(d.at(a, step, metric), d.at(b, step, metric))
      if not t["n"]:
        continue
      rows += 1
      lines.append(f"| {d.exp.methods[a]} - {d.exp.methods[b]} | {label} | {t['diff']:+.3f} | "
                   + " / ".join(f"{x:+.3f}" for x in t["diffs"])
                   + f" | {t['wins']} of {t['n']} | {pvalue(t['t_p'])} | {pvalue(t['signflip_p'])} |")
  return lines if rows else []


def train_entropy(d: Data, window: int = 25) -> list[str]:
  """Mean training-row entropy over the first and the last `window` logged steps, per method and seed."""
  lines = []
  for m in d.methods:
    firsts, lasts = {}, {}
    for seed, run in d.res["runs"][m].items():
      t = run.get("train", {})
      vals = [v for v in t.get("entropy", []) if v is not None]
      if vals:
        firsts[seed] = sum(vals[:window]) / len(vals[:window])
        lasts[seed] = sum(vals[-window:]) / len(vals[-window:])
    if firsts:
      lines.append(f"| {d.exp.methods[m]} | {fmt(list(firsts.values()))} ({per_seed(firsts)}) | "
                   f"{fmt(list(lasts.values()))} ({per_seed(lasts)}) |")
  if not lines:
    return ["Training entropy per step: not stored in this results.json (runs made before compare.py kept "
            "every step's training metrics)."]
  return [f"Policy entropy of the training rows (per step, results.json `train`): mean over the first and the "
          f"last {window} logged steps.", "", f"| method | first {window} steps | last {window} steps |",
          "|---|---|---|", *lines]


def before_after(d: Data, step: int) -> list[str]:
  """Rows `label | before | now | change` for each method and baseline on the main metric and the
  compared metrics: the `previous` results at their own final step against these at `step`."""
  old = Data(dataclasses.replace(d.exp, results=d.exp.previous))
  old_step = old.final_step(old.methods)
  metrics = [d.exp.main_metric] + [m for m in (d.exp.compared or d.exp.metrics) if m != d.exp.main_metric]
  lines = [f"Against the runs before issue 35's fixes (`{d.exp.previous}`, {old.res.get('device', '?')}, "
           f"final step {old_step}; change = difference of the means):", "",
           "| | metric | before | now | change |", "|---|---|---|---|---|"]
  for metric in metrics:
    rows = [(f"{d.exp.methods[m]}", old.at(m, old_step, metric) if m in old.methods else {}, d.at(m, step, metric))
            for m in d.methods]
    nb, ob = d.baselines(metric), old.baselines(metric)
    rows += [(label, ob.get(label, {}), v) for label, v in nb.items() if label != "base model (step 0)"]
    for label, before, now in rows:
      change = (f"{sum(now.values()) / len(now) - sum(before.values()) / len(before):+.3f}"
                if before and now else "-")
      lines.append(f"| {label} | {d.exp.metrics[metric]} | {fmt(list(before.values()))} | "
                   f"{fmt(list(now.values()))} | {change} |")
  return lines


def experiment_block(name: str) -> str:
  exp = EXPERIMENTS[name]
  d = Data(exp)
  step = d.final_step(d.methods)
  res = d.res
  if step is None:
    return f"**{exp.title}:** no evaluation step that every run of {', '.join(d.methods)} reached (`{exp.results}`)."
  head = (f"**{exp.title}: {len(d.seeds)} seeds ({', '.join(d.seeds)}), evaluation at step {step}"
          + ("".join(f" (+{o} for {exp.methods[m]})" for m, o in exp.offset.items() if m in d.methods))
          + f".** Device: {res.get('device', '?')}. Generated by `python -m experiments.report` from "
          f"`{exp.results}`.")
  out = [head, "", *table(d, step), "", above_baselines(d, step)]
  comp = comparisons(d, step)
  if comp:
    out += ["", "Paired by seed (first minus second):", "", *comp]
  if name == "luffy":
    out += ["", *train_entropy(d)]
  if res.get("no_model_baselines_note"):
    out += ["", f"No-model baselines: {res['no_model_baselines_note']}."]
  if exp.previous and (ROOT / exp.previous).is_file():
    out += ["", *before_after(d, step)]
  return "\n".join(out)


def readme_block() -> str:
  """One row per experiment: the methods' main metric at the final step, the baselines, the comparisons."""
  lines = ["| experiment | result (mean ± 95% CI over seeds; per seed) | baselines (same held-out items) | "
           "paired by seed | where |", "|---|---|---|---|---|"]
  for name, exp in EXPERIMENTS.items():
    d = Data(exp)
    step, metric = d.final_step(d.methods), exp.main_metric
    if step is None:
      lines.append(f"| {exp.title} | no evaluation step that every run reached | | | `{exp.results}` |")
      continue
    res = "; ".join(f"{exp.methods[m]} {fmt(list(v.values()))} ({per_seed(v)})"
                    for m in d.methods if (v := d.at(m, step, metric)))
    base = "; ".join(f"{SHORT.get(label, label)} {fmt(list(v.values()))}" for label, v in d.baselines(metric).items())
    tests = []
    for a, b in exp.comparisons:
      if a in d.methods and b in d.methods:
        t = paired_test(d.at(a, step, metric), d.at(b, step, metric))
        tests.append(f"{exp.methods[a]} - {exp.methods[b]} {t['diff']:+.3f}, ahead in {t['wins']} of {t['n']}, "
                     f"sign-flip p {pvalue(t['signflip_p'])}")
    folder = str(pathlib.Path(exp.results).parent)
    lines.append(f"| {exp.title}, {len(d.seeds)} seeds, {exp.metrics[metric]} at step {step} | {res} | {base} | "
                 f"{'; '.join(tests) or '-'} | `{folder}/` |")
  return "\n".join(lines)


BLOCKS = {"readme": ("README.md", readme_block),
          **{n: (f"{pathlib.Path(e.results).parent}/RESULTS.md" if n != "grpo_arith" else
                 "experiments/grpo_arith/RESULTS.md", lambda n=n: experiment_block(n)) for n, e in EXPERIMENTS.items()}}


def render(text: str, name: str, body: str, path: str) -> str:
  """`text` with block `name` replaced by `body`; a clear error when its markers are missing."""
  pattern = re.compile(rf"(<!-- report:begin {name} -->\n)(?:.*?\n)?(<!-- report:end {name} -->)", re.S)
  if not pattern.search(text):
    raise SystemExit(f"{path}: no '<!-- report:begin {name} -->' ... '<!-- report:end {name} -->' block")
  return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text, count=1)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--check", action="store_true", help="only compare: exit 1 if a block is out of date")
  ap.add_argument("--blocks", nargs="*", default=list(BLOCKS), choices=list(BLOCKS))
  args = ap.parse_args(argv)
  stale = []
  for name in args.blocks:
    rel, make = BLOCKS[name]
    path = ROOT / rel
    text = path.read_text()
    new = render(text, name, make(), rel)
    if new != text:
      stale.append(f"{rel} ({name})")
      if not args.check:
        atomic_write_text(path, new)
  if args.check and stale:
    print("out of date (run python -m experiments.report): " + ", ".join(stale))
    return 1
  print(("rewrote: " + ", ".join(stale)) if stale else "every block is up to date")
  return 0


if __name__ == "__main__":
  sys.exit(main())
