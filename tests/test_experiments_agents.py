"""experiments/agents/run.py --smoke runs end to end on the tiny model and writes its report."""
from __future__ import annotations

import json

import pytest


@pytest.mark.long
def test_agents_experiment_smoke(tiny_smol, tmp_path):
  """In this process (a subprocess paid ~10 s more for its imports and tokenizer; both jobs run in-process
  in the script too): the RL and APO runs, results.json, the report and the plot."""
  out = tmp_path / "out"
  _load_run().main(["--smoke", "--model", tiny_smol, "--seeds", "0", "--out", str(out),
                    "--rl-set", "num_steps=1", "eval_at_start=False", "task.num_eval=2", "lora.targets=('q','v')"])
  res = json.loads((out / "results.json").read_text())
  assert list(res["rl"]) == ["0"] and 0 <= res["rl"]["0"]["after"] <= 1
  assert res["apo"]["split"] == {"gradient": 4, "val": 2, "test": 2} and res["apo"]["best_prompt"]
  md = (out / "RESULTS.md").read_text()
  assert "| 0 |" in md and "Best prompt" in md and (out / "accuracy_curve.png").exists()


def _load_run():
  import importlib
  return importlib.import_module("experiments.agents.run")


def test_apo_report_and_plot(tmp_path):
  """The APO section lists every candidate (rejected ones with their reason), the beam per round and the
  seed/best rows; the history plot is written."""
  mod = _load_run()
  cands = [{"id": 0, "prompt": "seed <calc>", "parent": None, "round": 0, "critique": "", "rejected": "",
            "scores": {"round 0 full val": 0.25, "round 1 val batch": 0.25}},
           {"id": 1, "prompt": "a | b\nc", "parent": 0, "round": 1, "critique": "x", "rejected": "lacks ['<calc>']",
            "scores": {}},
           {"id": 2, "prompt": "better <calc>", "parent": 0, "round": 1, "critique": "y", "rejected": "",
            "scores": {"round 1 val batch": 0.5, "round 1 full val": 0.5}}]
  hist = [{"round": 0, "beam": [0], "beam_scores": [0.25], "leader_full_val": 0.25, "best": 0, "best_score": 0.25,
           "elapsed_s": 1.0},
          {"round": 1, "beam": [2, 0], "beam_scores": [0.5, 0.25], "leader_full_val": 0.5, "best": 2,
           "best_score": 0.5, "elapsed_s": 9.0}]
  ap = {"settings": {}, "split": {}, "model": {}, "rounds_done": 1, "num_candidates": 2, "num_rejected": 1,
        "search_s": 9.0, "test_s": 3.0, "seed_val": 0.25, "seed_test_greedy": 0.125, "best_id": 2, "best_val": 0.5,
        "best_test_greedy": 0.25, "best_prompt": "better <calc>", "candidates": cands, "history": hist}
  args = type("A", (), {"model": "m"})()
  md = mod.report(args, {}, ap, 12.0)
  assert "| seed | 0.250 | 0.125 |" in md and "| best (candidate 2) | 0.500 | 0.250 |" in md
  assert "| 1 | 0 | 1 |  | lacks ['<calc>'] | a / b c |" in md
  assert "| 1 | 2 (0.500), 0 (0.250) | 0.500 | 2 (0.500) | 9 |" in md
  mod.plot_apo(ap, str(tmp_path / "p.png"))
  assert (tmp_path / "p.png").stat().st_size > 1000
