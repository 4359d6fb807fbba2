"""The experiment's figure (routing share, regret, held-out accuracy) and RESULTS.md from results.json."""
from __future__ import annotations

import pathlib

import numpy as np

from fineflax.io import atomic_write_text

METRICS = (("exact_match_lenient", "exact match"), ("math_last_number", "last number correct"))


def plot(result: dict, path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  r, ab = result["routing"], result["ab"]
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  k = np.arange(1, len(r["rolling_share"]) + 1)
  ax = axes[0]
  ax.plot(k, r["rolling_share"], label=f"share to {r['best']} (trailing {r['rolling_window']})")
  ax.axhline(0.5, color="gray", ls=":", label="uniform")
  ax.set_ylim(-0.02, 1.02)
  ax.set_xlabel("request (order of feedback)")
  ax.set_ylabel("share")
  ax.set_title(f"router ({result['router']}): last {r['last']} -> {r['share_last']:.0%} to {r['best']}")
  ax.legend(loc="lower right")
  ax = axes[1]
  ax.plot(k, r["cumulative_regret"], label="router")
  ax.plot(k, k * r["uniform_regret_per_request"], ls="--", label="uniform routing")
  ax.set_xlabel("request")
  ax.set_ylabel("cumulative pseudo-regret")
  ax.set_title("regret (empirical mean rewards)")
  ax.legend()
  ax = axes[2]
  bars = _accuracy_bars(result)
  colors = {"tuned": "tab:blue", "noisy before": "tab:red", "noisy after SFT": "tab:green"}
  metrics = list(dict.fromkeys(name for _, name, _ in bars))
  whos = list(dict.fromkeys(who for who, _, _ in bars))
  width = 0.8 / len(whos)
  for j, who in enumerate(whos):
    ds = [d for w, _, d in bars if w == who]
    x = np.arange(len(ds)) + (j - (len(whos) - 1) / 2) * width
    ax.bar(x, [d["value"] for d in ds], width, color=colors[who], label=who,
           yerr=[[d["value"] - d["lo"] for d in ds], [d["hi"] - d["value"] for d in ds]], capsize=3)
  ax.set_xticks(range(len(metrics)), metrics)
  ax.set_ylim(0, 1)
  ax.set_ylabel("accuracy")
  ax.legend()
  ax.set_title(f"held-out questions (n={ab['n']}, bootstrap 95% CI)")
  fig.suptitle(f"adaptation loop, {pathlib.Path(str(result['model'])).name} NF4 + LoRA ({result['device']})")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _accuracy_bars(result: dict) -> list[tuple[str, str, dict]]:
  """(variant, metric name, {"value", "lo", "hi"}) for tuned (when the reference eval ran), noisy before
  and noisy after, per metric."""
  ab, ref = result["ab"], result.get("ab_reference")
  out = []
  for m, name in METRICS:
    if m not in ab["metrics"]:
      continue
    if ref and m in ref["metrics"]:
      out.append(("tuned", name, ref["metrics"][m]["a"]))
    out += [("noisy before", name, ab["metrics"][m]["a"]), ("noisy after SFT", name, ab["metrics"][m]["b"])]
  return out


def _summary(result: dict) -> str:
  """The headline numbers of a run."""
  r, ab, ref = result["routing"], result["ab"], result.get("ab_reference")
  m = ab["metrics"]["math_last_number"]
  d = m["a_minus_b"]
  gain = {"value": -d["value"], "lo": -d["hi"], "hi": -d["lo"]}  # after - before
  lines = [f"- router: **{r['share_last']:.0%}** of the last {r['last']} requests went to the better variant "
           f"({r['best']}, live reward {r['variants'][r['best']]['mean_reward']:.2f}).",
           f"- the weak variant on {ab['n']} held-out questions: **{100 * m['a']['value']:.1f}% -> "
           f"{100 * m['b']['value']:.1f}%** correct after {result['settings']['feedback_steps']} SFT steps on "
           f"{result['feedback_data']['sft_rows']} rewarded answers from the log (difference "
           f"{_ci(gain)} points, "
           f"bootstrap 95% CI)."]
  if ref:
    t = ref["metrics"]["math_last_number"]
    lines.append(f"- for scale, the better variant scores {100 * t['a']['value']:.1f}% on the same questions "
                 f"(tuned - weak-after: {_ci(t['a_minus_b'])} points).")
  return "\n".join(lines)


def _metric_rows(ab: dict) -> str:
  return "\n".join(f"| {name} | {_ci(ab['metrics'][m]['a'])} | {_ci(ab['metrics'][m]['b'])} | "
                   f"{_ci(ab['metrics'][m]['a_minus_b'])} |" for m, name in METRICS if m in ab["metrics"])


def _ci(d: dict, pct: bool = True) -> str:
  f = (lambda x: f"{100 * x:.1f}") if pct else (lambda x: f"{x:.3f}")
  return f"{f(d['value'])} [{f(d['lo'])}, {f(d['hi'])}]"


def write_markdown(result: dict, path) -> None:
  r, ab, fb, t, s = result["routing"], result["ab"], result["feedback_data"], result["times"], result["settings"]
  var = r["variants"]
  rows = "\n".join(f"| {v} | {d['requests']} | {d['mean_reward']:.3f} |" for v, d in var.items())
  metric_rows = _metric_rows(ab)
  ref = result.get("ab_reference")
  ref_md = "" if not ref else f"""
For scale, the better variant on the same held-out questions (`{result['eval_reference_report']}`):

| metric | tuned | noisy after | tuned - noisy after |
|---|---|---|---|
{_metric_rows(ref)}
"""
  cmds = "\n".join(result["commands"])
  times = ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in t.items())
  md = f"""# Adaptation loop: serve two variants, route on feedback, train on the log, A/B ({result['date']})

Command (device: {result['device']}, 2 cores shared with other jobs; wall time {t['total_s'] / 60:.1f} min):

```bash
{result['command']}
```

{_summary(result)}

Setting: base `{result['model']}` quantised to NF4, f32 compute. Two variants, both QLoRA adapters (r=16,
alpha=32, all linears) made by the SFT job (`configs/quickstart.py`, {s['variant_steps']} steps x
{s['batch_size']} rows):
**tuned** on the bundled arithmetic chats ("What is 17 + 25?" -> "17 + 25 = 42."), **noisy** on the same chats
with every result shifted by a random non-zero d in [-9, 9] (a fine-tune on buggy labels: it keeps the
answer format and gets the sums wrong). Both are served from one NF4 base by `python -m fineflax.serve`
({s['users']} decode slots). {s['users']} simulated users (threads, `openai` client) ask {s['requests']} questions
"What is a +/- b?" (a in 61..99, b in 2..40; none in the adapters' training chats) with `model="auto"`,
greedy, max {s['max_tokens']} tokens, and POST reward 1/0 (`math_last_number`: the reply's last number is
the result) to `/feedback`. Router: {result['router']} on the logged rewards (`--router`; Thompson because
UCB1's bonus sqrt(2 ln N / n) keeps sending the worse arm about 8 ln N / gap^2 requests, which at a reward
gap near 0.2 is more than this whole run).

## Routing

| variant | requests | mean reward |
|---|---|---|
{rows}

- better variant: **{r['best']}**; share of the last {r['last']} requests routed to it: **{r['share_last']:.1%}**
  (whole run: {r['share_all']:.1%}).
- cumulative pseudo-regret (gap of empirical mean rewards) after {len(r['cumulative_regret'])} requests:
  {r['cumulative_regret'][-1] if r['cumulative_regret'] else 0:.1f}, uniform routing:
  {len(r['cumulative_regret']) * r['uniform_regret_per_request']:.1f}.
- the **{r['best']}** variant's live reward is its accuracy on the users' questions; the other variant's
  requests are few, so its mean is rough.
- routing order at the start: a variant with no feedback yet is picked first, and requests still in flight
  do not count, so with {s['users']} concurrent users the first ~{s['users']} requests all go to the first
  variant and the next ~{s['users']} to the other, before any reward steers the router (visible as the dip at
  the left of the share curve).

## Reward log -> SFT data -> the weak variant

`fineflax.data.from_feedback --min-reward {result['min_reward']}`: {fb['rated']} rated responses ->
{fb['sft_rows']} SFT rows (by variant: {fb['sft_rows_by_variant']}), {fb.get('pairs', 0)} preference pairs (a prompt
gets a pair only when it has two different answers; each question was asked once, so there are none here). The SFT job then continues the
**noisy** adapter (`--config.lora.init_from`) for {s['feedback_steps']} steps on those rows.

## A/B on held-out questions: noisy before (A) vs noisy after SFT on the log (B)

`python -m fineflax.evals`, {ab['n']} questions disjoint from the users'
({'checked' if result['heldout_disjoint_from_users'] else 'NOT disjoint'}), greedy, NF4 base in-process; values in %, bootstrap
95% CI of the paired difference; A - B < 0 means the SFT helped. Exact match accepts the bare number or the
equation "a op b = c" (SQuAD normalisation); last number correct is `math_last_number`.

| metric | A: noisy before | B: noisy after | A - B |
|---|---|---|---|
{metric_rows}

{ref_md}
Notes. SmolLM2-135M on an NF4 base is weak at two-digit arithmetic: the better variant gets about one
question in four or five right, so the log yields few SFT rows and all the gains are bounded by what the
base can compute; the loop's job here is to move the weak variant from a wrong-value habit to the good
variant's behaviour, which the A/B measures. All answers have the form "a op b = c.", so exact match and
last-number accuracy coincide. One run, one seed; the CIs are over questions, not over reruns.

Judge: skipped. The only judge available offline is SmolLM2-135M itself, whose NF4 base answers these
questions mostly wrong; its verdicts would be noise next to an exact, verifiable task metric.
Full report: [{result['eval_report']}]({result['eval_report']}).

![adaptation loop](adaptation_loop.png)

Times: {times}.

Exact commands run (in order):

```bash
{cmds}
```
"""
  atomic_write_text(pathlib.Path(path), md)


if __name__ == "__main__":  # re-render from a results.json: python -m experiments.adaptation_loop.report DIR
  import json
  import sys
  folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent)
  res = json.loads((folder / "results.json").read_text())
  plot(res, folder / "adaptation_loop.png")
  write_markdown(res, folder / "RESULTS.md")
