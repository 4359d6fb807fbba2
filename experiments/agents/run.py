"""Agents: RL of the calculator-tool agent from its traces (held-out accuracy before/after, >= 3 seeds) and APO
of its system prompt with the local model as agent, critic and editor.

  python -m experiments.agents.run --out experiments/agents/out                       # GPU (~1 h on one H100)
  python -m experiments.agents.run --smoke --model /path/tiny --out /tmp/agents         # CPU smoke test
  python -m experiments.agents.run --skip-rl --apo-presets gpu5 --model X.gguf --out /root/work/apo  # APO, ~5 min
  options: --seeds 0 1 2, --skip-rl / --skip-apo, --rl-set / --apo-set key=value overrides, --apo-presets

Runs `fineflax.jobs.agent_rl` (configs/agent_rl.py) once per seed and `fineflax.jobs.apo` (configs/apo.py),
then writes results.json, accuracy_curve.png and RESULTS.md (command, device, wall time, tables) into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import time


from experiments.common import command_line, device_name, load_config, plot_curves
from fineflax.io import atomic_write_text
from fineflax.runs import add_output_args, output_folder_or_exit


def rl_runs(args, presets):
  from fineflax.jobs import agent_rl
  out = {}
  for seed in args.seeds:
    config = load_config(f"configs/agent_rl.py:{presets}", [f"model.source={args.model}", f"seed={seed}", *args.rl_set])
    t0 = time.time()
    res = agent_rl.run(config, os.path.join(args.out, f"rl_seed{seed}"))
    evals = [h for h in res["history"] if "eval_accuracy" in h]
    out[seed] = {"history": res["history"], "before": evals[0]["eval_accuracy"], "after": evals[-1]["eval_accuracy"],
                 "wall_s": time.time() - t0, "num_eval": config.task.num_eval, "num_steps": config.num_steps,
                 "prompts_per_step": config.rl.prompts_per_step, "group_size": config.rl.group_size}
  return out


def apo_run(args, presets):
  from fineflax.jobs import apo
  presets = ",".join(p for p in (presets, args.apo_presets) if p)
  config = load_config(f"configs/apo.py:{presets}", [f"model.source={args.model}", *args.apo_set])
  t0 = time.time()
  res = apo.run(config, os.path.join(args.out, "apo"))["result"]
  res["wall_s"] = time.time() - t0
  res["settings"] = {k: config.apo[k] for k in ("val_batch_size", "gradient_batch_size", "beam_width",
                                                 "branch_factor", "beam_rounds", "time_budget_s")}
  res["model"] = {"quant": config.model.quant, "dtype": config.model.dtype, "max_calls": config.agent.max_calls,
                  "critic/editor max_tokens": config.apo.editor.max_tokens}
  return res


def plot_apo(ap, path):
  """Each candidate's validation-batch score at the round it was scored, a line from its parent; the seed
  and the best on the whole validation set."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  cands = {c["id"]: c for c in ap["candidates"]}
  first = {}
  for c in cands.values():
    for k, v in c["scores"].items():
      rnd = int(k.split()[1])
      first.setdefault(c["id"], (rnd, v))
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, (rnd, v) in first.items():
    p = cands[i]["parent"]
    if p in first:
      ax.plot([first[p][0], rnd], [first[p][1], v], color="0.7", lw=0.8, zorder=1)
  ax.scatter([r for r, _ in first.values()], [v for _, v in first.values()], zorder=2, label="candidate")
  for i, (rnd, v) in first.items():
    ax.annotate(str(i), (rnd, v), textcoords="offset points", xytext=(4, 2), fontsize=8)
  h = ap["history"]
  ax.plot([x["round"] for x in h], [x["best_score"] for x in h], "k--", label="best (full validation)")
  rej = [cands[i]["round"] for i in cands if cands[i]["rejected"]]
  if rej:
    ax.scatter(rej, [0.0] * len(rej), marker="x", color="red", label="rejected (not scored)")
  ax.set_xticks(range(max(x["round"] for x in h) + 1))
  ax.set_xlabel("round")
  ax.set_ylabel("validation accuracy (greedy)")
  ax.set_title("APO of the calculator agent's prompt")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def report(args, rl, ap, wall) -> str:
  from fineflax.runs import mean_ci95
  lines = [f"## Agents ({time.strftime('%Y-%m-%d')})", "", f"- command: `{command_line()}`",
           f"- device: {device_name()}; wall time {wall:.0f} s", f"- model: {args.model}", ""]
  if rl:
    first = next(iter(rl.values()))
    b, a = [r["before"] for r in rl.values()], [r["after"] for r in rl.values()]
    (mb, cb), (ma, ca) = mean_ci95(b), mean_ci95(a)
    lines += ["### RL of the calculator agent (fineflax.jobs.agent_rl)", "",
              f"{first['num_steps']} steps x {first['prompts_per_step']} problems x {first['group_size']} rollouts; "
              f"held-out accuracy = greedy rollouts on {first['num_eval']} test-split problems.", "",
              "| seed | before | after | wall (s) |", "|---|---|---|---|"]
    lines += [f"| {s} | {r['before']:.3f} | {r['after']:.3f} | {r['wall_s']:.0f} |" for s, r in rl.items()]
    lines += [f"| mean ± 95% CI | {mb:.3f} ± {cb:.3f} | {ma:.3f} ± {ca:.3f} | |", "", "![accuracy](accuracy_curve.png)", ""]
  if ap:
    lines += ["### APO of the calculator agent's prompt (fineflax.jobs.apo)", "",
              f"settings {ap['settings']}; split {ap['split']} (gradient / validation from the train split, test "
              "from the held-out split).", "",
              f"model {ap['model']}; {ap['rounds_done']} rounds done, {ap['num_candidates']} candidates "
              f"({ap['num_rejected']} rejected); search {ap['search_s']:.0f} s, test {ap['test_s']:.0f} s.", "",
              "| prompt | validation (full, greedy) | test (greedy) |", "|---|---|---|",
              f"| seed | {ap['seed_val']:.3f} | {ap['seed_test_greedy']:.3f} |",
              f"| best (candidate {ap['best_id']}) | {ap['best_val']:.3f} | {ap['best_test_greedy']:.3f} |", "",
              "Best prompt:", "", "```", ap["best_prompt"], "```", "",
              "| candidate | parent | round | scores | rejected | prompt (first 160 chars) |",
              "|---|---|---|---|---|---|"]
    for c in ap["candidates"]:
      scores = ", ".join(f"{k}: {v:.3f}" for k, v in c["scores"].items())
      text = c["prompt"][:160].replace("\n", " ").replace("|", "/")
      lines.append(f"| {c['id']} | {c['parent']} | {c['round']} | {scores} | {c['rejected']} | {text} |")
    lines += ["", "| round | beam (val batch score) | leader full val | best | elapsed (s) |", "|---|---|---|---|---|"]
    for h in ap["history"]:
      beam = ", ".join(f"{i} ({v:.3f})" for i, v in zip(h["beam"], h["beam_scores"]))
      lines.append(f"| {h['round']} | {beam} | {h['leader_full_val']:.3f} | {h['best']} ({h['best_score']:.3f}) | "
                   f"{h['elapsed_s']:.0f} |")
    lines += ["", "![APO candidates](apo_history.png)", ""]
  return "\n".join(lines)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="smollm2-135m-instruct", help="model source (alias, folder or .gguf)")
  add_output_args(ap, "agents")
  ap.add_argument("--smoke", action="store_true", help="CPU smoke variant of both configs")
  ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  ap.add_argument("--skip-rl", action="store_true")
  ap.add_argument("--skip-apo", action="store_true")
  ap.add_argument("--rl-set", nargs="*", default=[], help="configs/agent_rl.py overrides a.b=value")
  ap.add_argument("--apo-set", nargs="*", default=[], help="configs/apo.py overrides a.b=value")
  ap.add_argument("--apo-presets", default="", help="configs/apo.py presets, e.g. cpu or gpu5")
  args = ap.parse_args(argv)
  output_folder_or_exit(args.out, args.overwrite)
  presets = "smoke" if args.smoke else ""
  os.makedirs(args.out, exist_ok=True)
  t0 = time.time()
  rl = {} if args.skip_rl else rl_runs(args, presets)
  apo = None if args.skip_apo else apo_run(args, presets)
  wall = time.time() - t0
  atomic_write_text(os.path.join(args.out, "results.json"),
                    json.dumps({"rl": rl, "apo": apo, "command": command_line(), "device": device_name()}, indent=1))
  if rl:
    series = {f"seed {s}": [([h["step"] for h in r["history"] if "eval_accuracy" in h],
                             [h["eval_accuracy"] for h in r["history"] if "eval_accuracy" in h])] for s, r in rl.items()}
    plot_curves(series, "held-out accuracy (greedy)", os.path.join(args.out, "accuracy_curve.png"),
                title=f"calculator agent RL ({device_name()})")
  if apo:
    plot_apo(apo, os.path.join(args.out, "apo_history.png"))
  md = report(args, rl, apo, wall)
  atomic_write_text(os.path.join(args.out, "RESULTS.md"), md)
  print(md)


if __name__ == "__main__":
  main()
