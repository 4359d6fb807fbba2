"""The A/B report: report.md (tables), ab.png (judge win/tie/loss and metric means with 95% CIs),
results.json (summary) and examples.jsonl (every answer, score and verdict); all written atomically."""
from __future__ import annotations

import io
import json
import pathlib

from fineflax.io import atomic_write_bytes, atomic_write_text


def _ci(d: dict, pct: bool = False) -> str:
  f = (lambda x: f"{100 * x:.1f}%") if pct else (lambda x: f"{x:.3f}")
  return f"{f(d['value'])} [{f(d['lo'])}, {f(d['hi'])}]"


def plot(summary: dict, path) -> pathlib.Path:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  metrics = summary["metrics"]
  panels = (1 if "judge" in summary else 0) + (1 if metrics else 0)
  fig, axes = plt.subplots(1, max(panels, 1), figsize=(5.5 * max(panels, 1), 3.2), squeeze=False)
  axes = list(axes[0])
  if "judge" in summary:
    ax, j = axes.pop(0), summary["judge"]
    names, colors = ("win", "tie", "loss"), ("tab:green", "tab:gray", "tab:red")
    vals = [j[k]["value"] for k in names]
    err = [[j[k]["value"] - j[k]["lo"] for k in names], [j[k]["hi"] - j[k]["value"] for k in names]]
    ax.bar(names, vals, color=colors, yerr=err, capsize=6)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of examples")
    ax.set_title(f"LLM judge, A vs B (n={summary['n']}, 95% CI)")
  if metrics:
    ax = axes.pop(0)
    xs = range(len(metrics))
    for k, (side, off, c) in enumerate((("a", -0.2, "tab:blue"), ("b", 0.2, "tab:orange"))):
      v = [metrics[m][side]["value"] for m in metrics]
      e = [[metrics[m][side]["value"] - metrics[m][side]["lo"] for m in metrics],
           [metrics[m][side]["hi"] - metrics[m][side]["value"] for m in metrics]]
      ax.bar([x + off for x in xs], v, width=0.4, yerr=e, capsize=5, color=c, label=side.upper())
    ax.set_xticks(list(xs), list(metrics))
    ax.set_title("task metrics (mean, 95% CI)")
    ax.legend()
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=110)
  plt.close(fig)
  return atomic_write_bytes(path, buf.getvalue())


def markdown(summary: dict, spec_a: str, spec_b: str, data: str, judge_desc: str | None, command: str) -> str:
  lines = ["# A/B evaluation", "", f"- A: `{spec_a}`", f"- B: `{spec_b}`", f"- eval set: `{data}` "
           f"({summary['n']} examples)", f"- judge: {f'`{judge_desc}`' if judge_desc else 'none'}",
           f"- command: `{command}`", "", "![A/B](ab.png)", ""]
  if summary["metrics"]:
    lines += ["## Task metrics (mean [95% bootstrap CI])", "", "| metric | A | B | A - B (paired) |",
              "|---|---|---|---|"]
    lines += [f"| {m} | {_ci(v['a'])} | {_ci(v['b'])} | {_ci(v['a_minus_b'])} |"
              for m, v in summary["metrics"].items()]
    lines.append("")
  if "judge" in summary:
    j = summary["judge"]
    lines += ["## LLM judge (both orders per example) [95% bootstrap CI]", "", "| A wins | tie | A loses | "
              "score (win + tie/2) |", "|---|---|---|---|",
              f"| {_ci(j['win'], True)} | {_ci(j['tie'], True)} | {_ci(j['loss'], True)} | {_ci(j['score'], True)} |",
              "", f"Orders disagreeing (position bias): {j['order_disagreements']} of {summary['n']}; "
              f"unparseable verdicts: {j['invalid_verdicts']}.", ""]
  return "\n".join(lines)


def write_report(out_dir, result: dict, *, spec_a: str, spec_b: str, data: str, judge_desc: str | None,
                 command: str) -> pathlib.Path:
  out = pathlib.Path(out_dir)
  summary = result["summary"]
  plot(summary, out / "ab.png")
  atomic_write_text(out / "results.json", json.dumps(
      {"a": spec_a, "b": spec_b, "data": data, "judge": judge_desc, **summary}, indent=2))
  atomic_write_text(out / "examples.jsonl", "".join(json.dumps(e, ensure_ascii=False) + "\n"
                                                    for e in result["examples"]))
  return atomic_write_text(out / "report.md", markdown(summary, spec_a, spec_b, data, judge_desc, command))


def write_many_report(out_dir, result: dict, *, specs: dict, data: str, judge_desc: str | None,
                      command: str) -> pathlib.Path:
  """report.md (per-variant metrics, judge against the baseline), results.json, examples.jsonl."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  s = result["summary"]
  metrics = list(next(iter(s["variants"].values()))["metrics"])
  lines = ["# Evaluation of several variants", "", *[f"- {n}: `{spec}`" for n, spec in specs.items()],
           f"- eval set: `{data}` ({s['n']} examples)", f"- judge: {f'`{judge_desc}`' if judge_desc else 'none'}",
           f"- command: `{command}`", "", "## Per variant (mean [95% bootstrap CI])", "",
           "| variant | " + " | ".join(metrics) + (" | judge vs " + s["baseline"] + ": win / tie / loss"
                                                   if judge_desc else "") + " |",
           "|---|" + "---|" * (len(metrics) + bool(judge_desc))]
  for n, v in s["variants"].items():
    j = v.get("judge_vs_baseline")
    judge = (f" | {_ci(j['win'], True)} / {_ci(j['tie'], True)} / {_ci(j['loss'], True)}" if j else
             (" | (baseline)" if judge_desc else ""))
    lines.append(f"| {n} | " + " | ".join(_ci(v["metrics"][m]) for m in metrics) + judge + " |")
  atomic_write_text(out / "results.json", json.dumps({"variants": specs, "data": data, "judge": judge_desc, **s},
                                                     indent=2))
  atomic_write_text(out / "examples.jsonl", "".join(json.dumps(e, ensure_ascii=False) + "\n"
                                                    for e in result["examples"]))
  return atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
