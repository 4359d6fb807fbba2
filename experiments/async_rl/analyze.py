"""Issue 47's quality check from experiments/async_rl/results.json (written by experiments/compare.py).

  python -m experiments.async_rl.analyze            # prints the tables, writes curves_ci.png
  python -m experiments.async_rl.analyze --write    # also rewrites RESULTS.md's generated block
  python -m experiments.async_rl.analyze --pool sync=A.json:sync+B.json:sync --pool async1=... --write
                                                    # arms pooled over several runs (the "pooled" block)

Held-out accuracy per evaluation step and arm, pooled over the seeds: k right answers of n = seeds x
task.num_eval greedy answers, with the Wilson 95% interval of the binomial proportion k / n. The question
of the issue: does the async_steps=1 arm's pooled accuracy lie inside the synchronous arm's interval at
every evaluation step? Limitation: the interval treats the n answers as independent draws, but the seeds
answer the SAME held-out problems (the split is fixed by task.eval_seed) and each seed's answers share one
trained adapter, so it ignores the between-seed (training) variance; with 2 seeds that variance cannot be
estimated usefully (a Student t interval over 2 seeds has t = 12.7). It is a check of "no visible
difference at this size", not an equivalence test.

Training metrics (mean over the RL steps and seeds, per arm): the rollout/learner mismatch KL (k3 and k1
estimators), max |delta log p|, the importance weights pi_old / pi_rollout (mean, max; rl.importance=none
here, so they are logged, not applied), the staleness, rewards and timings.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import re
from statistics import mean, stdev, variance

HERE = pathlib.Path(__file__).resolve().parent
LABELS = {"sync": "synchronous (async_steps=0)", "async1": "async_steps=1",
          "async1_none": "async_steps=1, importance none", "async1_tis": "async_steps=1, importance tis (C = 2)"}
TRAIN = ("reward_mean", "zero_variance_groups", "completion_length", "grad_norm", "staleness", "mismatch_kl",
         "mismatch_kl_k1", "mismatch_max_abs_dlogp", "is_weight_mean", "is_weight_max", "ratio_mean",
         "time_rollout_s", "time_update_s")


def arms_of(res: dict) -> list[str]:
  """The arms of a results dict, the synchronous reference ("sync") first."""
  if "sync" not in res["runs"]:
    raise SystemExit(f"results: no 'sync' arm among {sorted(res['runs'])}")
  return ["sync"] + [a for a in res["runs"] if a != "sync"]


def label(res: dict, arm: str) -> str:
  return LABELS.get(arm, f"{arm} ({'; '.join(res['methods'][arm]['overrides'])})")


def merge(specs: list[str]) -> dict:
  """One results dict from arms of several compare.py results.json files on the same config and common
  overrides: each spec "ARM=FILE:ARM[+FILE:ARM...]" makes arm ARM of the runs (seeds) of the named arms;
  a seed met twice in one arm is an error."""
  out, first = None, None
  for spec in specs:
    name, _, sources = spec.partition("=")
    if not name or not sources:
      raise SystemExit(f"--pool {spec!r}: expected ARM=FILE:ARM[+FILE:ARM...]")
    runs, overrides = {}, []
    for src in sources.split("+"):
      path, _, arm = src.rpartition(":")
      res = json.loads(pathlib.Path(path).read_text())
      if first is None:
        first = path
        out = {**{k: v for k, v in res.items() if k not in ("runs", "methods", "seeds")}, "runs": {}, "methods": {}}
      elif (res["config"], res["common"]) != (out["config"], out["common"]):
        raise SystemExit(f"--pool {spec!r}: {path} ran {res['config']} with {res['common']}, {first} ran "
                         f"{out['config']} with {out['common']}")
      if arm not in res["runs"]:
        raise SystemExit(f"--pool {spec!r}: {path} has no arm {arm!r} (it has {sorted(res['runs'])})")
      for seed, run in res["runs"][arm].items():
        if seed in runs:
          raise SystemExit(f"--pool {spec!r}: seed {seed} twice in arm {name!r}")
        runs[seed] = run
      overrides += [o for o in res["methods"][arm]["overrides"] if o not in overrides]
    out["runs"][name], out["methods"][name] = runs, {"presets": "", "overrides": overrides}
  out["seeds"] = sorted({int(s) for runs in out["runs"].values() for s in runs})
  return out


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
  """Wilson score 95% interval of a binomial proportion k / n."""
  if n == 0:
    return float("nan"), float("nan")
  p = k / n
  d = 1 + z * z / n
  c = (p + z * z / (2 * n)) / d
  h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
  return c - h, c + h


def pooled(res: dict, arm: str, num_eval: int) -> dict[int, tuple[int, int, list[float]]]:
  """step -> (right answers, answers, per-seed accuracies) over the seeds that evaluated the step."""
  out: dict[int, tuple[int, int, list[float]]] = {}
  for seed in sorted(res["runs"].get(arm, {}), key=int):
    for e in res["runs"][arm][seed]["evals"]:
      k, n, accs = out.get(e["step"], (0, 0, []))
      out[e["step"]] = (k + round(e["eval_accuracy"] * num_eval), n + num_eval, [*accs, e["eval_accuracy"]])
  return dict(sorted(out.items()))


def num_eval_of(res: dict) -> int:
  """Held-out questions per evaluation: the common override task.num_eval (grpo_arith) or dataset.num_eval."""
  for s in res["common"]:
    if s.startswith(("task.num_eval=", "dataset.num_eval=")) and int(s.split("=", 1)[1]) > 0:
      return int(s.split("=", 1)[1])
  raise SystemExit("results.json: no task.num_eval or dataset.num_eval (> 0) in the common overrides")


def accuracy_table(res: dict) -> tuple[str, dict[str, list[str]]]:
  """The pooled accuracy of every arm per evaluation step; each other arm against the sync arm's interval."""
  n_eval, arms = num_eval_of(res), arms_of(res)
  pools = {a: pooled(res, a, n_eval) for a in arms}
  head = [f"{label(res, a)}: pooled acc [Wilson 95%] (per seed)" for a in arms]
  for a in arms[1:]:
    head += [f"{a} - sync", f"{a} inside the sync interval?"]
  lines = ["| step | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
  verdicts: dict[str, list[str]] = {a: [] for a in arms[1:]}
  for step in sorted(set().union(*pools.values())):
    cells = []
    for arm in arms:
      if step not in pools[arm]:
        cells.append("-")
        continue
      k, n, accs = pools[arm][step]
      lo, hi = wilson(k, n)
      cells.append(f"{k}/{n} = {k / n:.3f} [{lo:.3f}, {hi:.3f}] ({' / '.join(f'{a:.3f}' for a in accs)})")
    for arm in arms[1:]:
      if step not in pools["sync"] or step not in pools[arm]:
        cells += ["-", "-"]
        continue
      (ks, ns, _), (ka, na, _) = pools["sync"][step], pools[arm][step]
      lo, hi = wilson(ks, ns)
      verdicts[arm].append("yes" if lo <= ka / na <= hi else "**no**")
      cells += [f"{ka / na - ks / ns:+.3f}", verdicts[arm][-1]]
    lines.append(f"| {step} | " + " | ".join(cells) + " |")
  return "\n".join(lines), verdicts


def train_table(res: dict) -> str:
  arms = arms_of(res)
  lines = ["| metric | " + " | ".join(label(res, a) for a in arms) + " |", "|---|" + "---|" * len(arms)]
  for m in TRAIN:
    cells = []
    for arm in arms:
      vals = [v for run in res["runs"].get(arm, {}).values() for s, v in zip(run["train"].get("step", []),
                                                                               run["train"].get(m, []))
              if v is not None]
      cells.append("-" if not vals else f"{sum(vals) / len(vals):.4g} (max {max(vals):.4g})")
    lines.append(f"| {m} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def per_step_table(res: dict, metrics=("reward_mean", "zero_variance_groups", "grad_norm", "staleness", "mismatch_kl",
                                       "mismatch_max_abs_dlogp", "is_weight_mean", "is_weight_max")) -> str:
  lines = ["| arm | seed | step | " + " | ".join(metrics) + " |", "|---|---|---|" + "---|" * len(metrics)]
  for arm in arms_of(res):
    for seed, run in sorted(res["runs"].get(arm, {}).items(), key=lambda x: int(x[0])):
      tr = run["train"]
      for i, step in enumerate(tr.get("step", [])):
        vals = [tr.get(m, [None] * (i + 1))[i] for m in metrics]
        lines.append(f"| {arm} | {seed} | {step} | " + " | ".join("-" if v is None else f"{v:.4g}" for v in vals)
                     + " |")
  return "\n".join(lines)


def plot(res: dict, path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  n_eval = num_eval_of(res)
  fig, ax = plt.subplots(figsize=(6.5, 4))
  for arm, color in zip(arms_of(res), ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")):
    for seed, run in res["runs"].get(arm, {}).items():
      ev = run["evals"]
      ax.plot([e["step"] for e in ev], [e["eval_accuracy"] for e in ev], color=color, alpha=0.35, lw=1,
              ls="--", marker=".")
    p = pooled(res, arm, n_eval)
    steps = list(p)
    acc = [k / n for k, n, _ in p.values()]
    ci = [wilson(k, n) for k, n, _ in p.values()]
    seeds = ", ".join(sorted(res["runs"][arm], key=int))
    ax.plot(steps, acc, color=color, lw=2, marker="o", label=f"{label(res, arm)} (pooled: seeds {seeds})")
    ax.fill_between(steps, [c[0] for c in ci], [c[1] for c in ci], color=color, alpha=0.15)
  ax.set_xlabel("step")
  ax.set_ylabel(f"held-out accuracy ({n_eval} problems, greedy)")
  ax.set_title(f"async_steps=1 vs synchronous, SmolLM2-135M ({res['config']}, {res['device']})\n"
               "dashed: per seed; band: Wilson 95% of the seeds' pooled answers", fontsize=9)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def learned(res: dict) -> str:
  """Whether each arm's pooled accuracy at its last evaluation lies above its step-0 Wilson interval."""
  n_eval, out = num_eval_of(res), []
  for arm in arms_of(res):
    p = pooled(res, arm, n_eval)
    if len(p) < 2:
      continue
    (k0, n0, _), (k1, n1, _) = p[min(p)], p[max(p)]
    lo0, hi0 = wilson(k0, n0)
    lo1, hi1 = wilson(k1, n1)
    verdict = "above" if lo1 > hi0 else "not above"
    out.append(f"{label(res, arm)}: step {min(p)} {k0 / n0:.3f} [{lo0:.3f}, {hi0:.3f}] -> step {max(p)} {k1 / n1:.3f} "
               f"[{lo1:.3f}, {hi1:.3f}] ({verdict} the step-{min(p)} interval)")
  return "Learning: " + "; ".join(out) + "."


def seed_level(res: dict, from_step: int = 6) -> str:
  """Between-seed view: each seed's mean held-out accuracy over the evaluations at steps >= from_step (after the
  arms part: they are identical through step 2, and 4 is the first step a stale batch can show), and for each
  other arm the Welch 95% interval of (arm mean - sync mean) over seeds, which unlike the pooled Wilson interval
  includes the training variance between seeds."""
  from scipy import stats
  arms = arms_of(res)
  per_seed = {a: [mean([e["eval_accuracy"] for e in run["evals"] if e["step"] >= from_step] or [0.0])
                  for _, run in sorted(res["runs"][a].items(), key=lambda x: int(x[0]))] for a in arms}
  lines = [f"| arm | per-seed mean accuracy, steps >= {from_step} | mean | - sync [Welch 95%] |", "|---|---|---|---|"]
  for a in arms:
    v, s = per_seed[a], per_seed["sync"]
    cell = "-"
    if a != "sync" and len(v) > 1 and len(s) > 1:
      se2 = variance(v) / len(v) + variance(s) / len(s)
      df = se2 ** 2 / ((variance(v) / len(v)) ** 2 / (len(v) - 1) + (variance(s) / len(s)) ** 2 / (len(s) - 1))
      h = stats.t.ppf(0.975, df) * se2 ** 0.5
      d = mean(v) - mean(s)
      cell = f"{d:+.3f} [{d - h:+.3f}, {d + h:+.3f}] (df {df:.1f})"
    lines.append(f"| {label(res, a)} | {' / '.join(f'{x:.3f}' for x in v)} | {mean(v):.3f} | {cell} |")
  return "\n".join(lines)


def seed_interval_table(res: dict) -> tuple[str, dict[str, list[bool]]]:
  """Per evaluation step: the synchronous arm's Student-t 95% interval of the mean accuracy over its seeds (the
  seeds as the unit, so the training variance is in it; wide with few seeds) and whether each other arm's seed
  mean lies inside it."""
  from scipy import stats
  n_eval, arms = num_eval_of(res), arms_of(res)
  per = {a: {step: accs for step, (_, _, accs) in pooled(res, a, n_eval).items()} for a in arms}  # per-seed accuracies
  n_sync = len(res["runs"]["sync"])
  head = ["step", f"sync mean [t 95%] over {n_sync} seeds", *(f"{a} mean (inside?)" for a in arms[1:])]
  lines = ["| " + " | ".join(head) + " |", "|---|" + "---|" * (len(head) - 1)]
  inside: dict[str, list[bool]] = {a: [] for a in arms[1:]}
  for step, v in sorted(per["sync"].items()):
    m = mean(v)
    h = stats.t.ppf(0.975, len(v) - 1) * stdev(v) / len(v) ** 0.5 if len(v) > 1 else float("nan")
    cells = [str(step), f"{m:.3f} [{m - h:.3f}, {m + h:.3f}]"]
    for a in arms[1:]:
      if step not in per[a]:
        cells.append("-")
        continue
      ma = mean(per[a][step])
      inside[a].append(m - h <= ma <= m + h)
      cells.append(f"{ma:.3f} ({'yes' if inside[a][-1] else '**no**'})")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines), inside


def block(res: dict, source: str = "`experiments/async_rl/results.json`") -> str:
  acc, verdicts = accuracy_table(res)
  inside = "; ".join(f"{label(res, a)} inside the synchronous arm's Wilson 95% interval at "
                     f"{sum(v == 'yes' for v in vs)} of {len(vs)} evaluation steps" for a, vs in verdicts.items())
  seeds = "; ".join(f"{a}: {', '.join(sorted(res['runs'][a], key=int))}" for a in arms_of(res))
  seed_table, by_seed = seed_interval_table(res)
  seed_inside = "; ".join(f"{label(res, a)} inside the synchronous arm's t 95% interval at {sum(v)} of {len(v)} "
                          "evaluation steps" for a, v in by_seed.items())
  return (f"Held-out accuracy, pooled over seeds ({seeds}; generated by `python -m experiments.async_rl.analyze` "
          f"from {source}; device: {res['device']}):\n\n{acc}\n\n{inside}.\n\n{learned(res)}\n\n"
          f"Between seeds (the training variance the pooled interval leaves out):\n\n{seed_level(res)}\n\n"
          f"Per step, seeds as the unit:\n\n{seed_table}\n\n{seed_inside}.\n\n"
          f"Training metrics, mean (max) over every RL step of every seed:\n\n{train_table(res)}\n\n"
          f"Per step:\n\n{per_step_table(res)}")


def followup_table(res: dict, other: dict) -> str:
  """Every arm of `other` (a second compare.py results.json on the same task, e.g. async_steps=1 with TIS),
  pooled over its seeds, against the synchronous arm's Wilson 95% interval of `res`."""
  n_eval = num_eval_of(res)
  sync = pooled(res, "sync", n_eval)
  lines = []
  for arm in other["runs"]:
    p = pooled(other, arm, num_eval_of(other))
    seeds = sorted(other["runs"][arm], key=int)
    lines += [f"Arm `{arm}` ({'; '.join(other['methods'][arm]['overrides'])}), seeds {', '.join(seeds)}:", "",
              f"| step | synchronous [Wilson 95%] | {arm} pooled [Wilson 95%] (per seed) | inside the sync "
              "interval? |",
              "|---|---|---|---|"]
    inside = []
    for step in sorted(set(sync) & set(p)):
      ks, ns, _ = sync[step]
      ka, na, accs = p[step]
      lo, hi = wilson(ks, ns)
      alo, ahi = wilson(ka, na)
      inside.append(lo <= ka / na <= hi)
      lines.append(f"| {step} | {ks / ns:.3f} [{lo:.3f}, {hi:.3f}] | {ka}/{na} = {ka / na:.3f} [{alo:.3f}, {ahi:.3f}] "
                   f"({' / '.join(f'{a:.3f}' for a in accs)}) | {'yes' if inside[-1] else '**no**'} |")
    lines += ["", f"{arm} inside the synchronous arm's Wilson 95% interval at {sum(inside)} of {len(inside)} "
              "evaluation steps.", ""]
  return "\n".join(lines).rstrip()


def replace_block(text: str, name: str, body: str, md) -> str:
  pat = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
  if not pat.search(text):
    raise SystemExit(f"{md}: no <!-- {name}:begin --> ... <!-- {name}:end --> block")
  return pat.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text, count=1)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--results", default=str(HERE / "results.json"))
  ap.add_argument("--write", action="store_true", help="rewrite the generated block(s) of RESULTS.md")
  ap.add_argument("--followup", default="", help="a second results.json (e.g. followup_tis/results.json): its "
                  "arms against the synchronous interval (the followup block of RESULTS.md)")
  ap.add_argument("--pool", action="append", default=[], metavar="ARM=FILE:ARM[+FILE:ARM...]",
                  help="arms pooled over several runs' seeds (repeat per arm; a 'sync' arm needed): the pooled block "
                  "of RESULTS.md and curves_pooled.png instead of the above")
  args = ap.parse_args(argv)
  if args.pool:
    res = merge(args.pool)
    body = block(res, source="`--pool " + " --pool ".join(args.pool) + "`")
    print(body)
    plot(res, HERE / "curves_pooled.png")
    if args.write:
      md = HERE / "RESULTS.md"
      md.write_text(replace_block(md.read_text(), "pooled", body, md))
    return 0
  res = json.loads(pathlib.Path(args.results).read_text())
  body = block(res)
  print(body)
  plot(res, pathlib.Path(args.results).parent / "curves_ci.png")
  follow = followup_table(res, json.loads(pathlib.Path(args.followup).read_text())) if args.followup else ""
  if follow:
    print("\n" + follow)
  if args.write:
    md = HERE / "RESULTS.md"
    text = replace_block(md.read_text(), "analyze", body, md)
    md.write_text(replace_block(text, "followup", follow, md) if follow else text)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
