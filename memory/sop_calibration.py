"""Calibrates the SOP routing threshold on a labelled set and scores routing on another.

  python -m memory.sop_calibration [--calibration memory/sops_eval/calibration.jsonl]
                                   [--heldout tests/data/sop_routing_heldout.jsonl]

A set is JSON lines {"query": str, "sop": SOP name or null (off-topic: must not be routed)}.
Threshold rule (calibrate): among thresholds that route no off-topic query of the calibration set, take
the one routing the most paraphrases to the right SOP; the threshold is placed halfway between the
highest off-topic similarity and the lowest top similarity above it, for margin on both sides.
"""
from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

from memory.sop import SOPManager

HERE = pathlib.Path(__file__).parent
CALIBRATION = HERE / "sops_eval" / "calibration.jsonl"
HELDOUT = HERE.parent / "tests" / "data" / "sop_routing_heldout.jsonl"


def load_set(path: str | pathlib.Path) -> list[dict]:
  rows = []
  for i, line in enumerate(pathlib.Path(path).read_text(encoding="utf-8").splitlines(), 1):
    if line.strip():
      row = json.loads(line)
      if set(row) != {"query", "sop"}:
        raise ValueError(f"{path}:{i}: expected keys query, sop; got {sorted(row)}")
      rows.append(row)
  return rows


def calibrate(top_sim: np.ndarray, right: np.ndarray, off_topic: np.ndarray) -> float:
  """The threshold (see module docstring) from each query's best similarity, whether its best SOP is the
  labelled one, and whether it is off-topic."""
  floor = float(top_sim[off_topic].max()) if off_topic.any() else -1.0
  above = top_sim[(~off_topic) & right & (top_sim > floor)]
  return (floor + float(above.min())) / 2 if len(above) else floor + 1e-6


def evaluate(manager: SOPManager, rows: list[dict]) -> dict:
  """Routes each query with manager.match: right / wrong / unrouted paraphrases, routed off-topic ones."""
  out = {"paraphrases": 0, "right": 0, "wrong": 0, "unrouted": 0, "off_topic": 0, "off_topic_routed": 0}
  for row in rows:
    best = manager.match(row["query"])
    got = best[0].sop.name if best else None
    if row["sop"] is None:
      out["off_topic"] += 1
      out["off_topic_routed"] += got is not None
    else:
      out["paraphrases"] += 1
      out["right" if got == row["sop"] else "unrouted" if got is None else "wrong"] += 1
  return out


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(prog="python -m memory.sop_calibration", description=__doc__.split("\n\n")[0])
  parser.add_argument("--calibration", default=str(CALIBRATION))
  parser.add_argument("--heldout", default=str(HELDOUT))
  args = parser.parse_args(argv)
  manager = SOPManager(embedding_function="default")
  names = [s.name for s in manager.sops]
  cal = load_set(args.calibration)
  sims = manager.similarities([r["query"] for r in cal])
  best = sims.argmax(1)
  right = np.array([names[b] == r["sop"] for b, r in zip(best, cal)])
  off = np.array([r["sop"] is None for r in cal])
  threshold = calibrate(sims.max(1), right, off)
  report = {"threshold": round(threshold, 4), "calibration_nearest_right": int(right[~off].sum()),
            "calibration_paraphrases": int((~off).sum()),
            "calibration_max_off_topic_similarity": round(float(sims.max(1)[off].max()), 4)}
  for name, path in (("calibration", args.calibration), ("heldout", args.heldout)):
    for label, m in (("calibrated", SOPManager(embedding_function=manager.embedding_function,
                                               min_similarity=threshold)),
                     ("triggers only", SOPManager())):
      report[f"{name} {label}"] = evaluate(m, load_set(path))
  print(json.dumps(report, indent=1))
  return report


if __name__ == "__main__":
  main()
