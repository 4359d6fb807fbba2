"""Regret curves of the server's bandit router (`fineflax.serve.router`) on simulated traffic.

  python -m experiments.bandit_router.regret [--out runs/experiments/bandit_router [--overwrite]] [--steps 2000] [--seeds 20]

Two variants with Bernoulli rewards (rates 0.3 and 0.6, as the router test); each request is routed,
its reward drawn and fed back at once. Cumulative expected regret after t requests =
sum_{s <= t} (max rate - rate of the variant chosen at s); uniform routing's is 0.15 t. Curves are the
mean over `--seeds` simulations (band: 10th-90th percentile). Writes regret.png and regret.json.
"""
from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np


from fineflax.serve.router import Router, simulate
from fineflax.io import atomic_write_json
from fineflax.runs import add_output_args, output_folder_or_exit

RATES = {"weak": 0.3, "strong": 0.6}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_output_args(ap, "bandit_router")
  ap.add_argument("--steps", type=int, default=2000)
  ap.add_argument("--seeds", type=int, default=20)
  args = ap.parse_args(argv)
  output_folder_or_exit(args.out, args.overwrite)
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  fig, ax = plt.subplots(figsize=(6, 4))
  t = np.arange(1, args.steps + 1)
  summary = {"rates": RATES, "steps": args.steps, "seeds": args.seeds}
  for kind in ("ucb1", "thompson"):
    curves, shares = [], []
    for seed in range(args.seeds):
      chosen, regret = simulate(Router(list(RATES), kind=kind, seed=seed), RATES, args.steps, seed=100 + seed)
      curves.append(regret)
      shares.append(np.mean([c == "strong" for c in chosen[-500:]]))
    curves = np.array(curves)
    ax.plot(t, curves.mean(0), label=kind)
    ax.fill_between(t, np.percentile(curves, 10, 0), np.percentile(curves, 90, 0), alpha=0.2)
    summary[kind] = {"final_regret_mean": float(curves[:, -1].mean()),
                     "last500_share_better_mean": float(np.mean(shares)),
                     "last500_share_better_min": float(np.min(shares))}
  ax.plot(t, 0.15 * t, "k--", label="uniform (0.15 t)")
  ax.set_xlabel("requests")
  ax.set_ylabel("cumulative expected regret")
  ax.set_ylim(0, max(summary["ucb1"]["final_regret_mean"], summary["thompson"]["final_regret_mean"]) * 2.5)
  ax.set_title(f"Bandit router, rates {RATES['weak']} vs {RATES['strong']}, mean of {args.seeds} runs")
  ax.legend()
  fig.tight_layout()
  fig.savefig(out / "regret.png", dpi=120)
  atomic_write_json(out / "regret.json", summary, indent=2)
  print(json.dumps(summary, indent=2))


if __name__ == "__main__":
  main()
