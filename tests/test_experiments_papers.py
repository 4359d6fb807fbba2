"""The papers' experiments (issue 16) end to end in --smoke mode on a tiny model: every method runs, and
the tables, results.json and plots are written (experiments/luffy/run.py, experiments/search_r1/run.py)."""
import json

import pytest

from experiments.luffy import run as luffy
from experiments.search_r1 import run as search_r1

# Adapters on q and v only: the same jobs, with 4 adapter tensors per layer instead of 14, so each run's
# train step compiles ~15% faster (adapters on every linear: tests/test_jobs_common.py, test_lora_*.py).
QV = "lora.targets=('q','v')"


@pytest.mark.long
def test_luffy_five_way_smoke(tiny_smol, tmp_path):
  out = tmp_path / "luffy"
  assert luffy.main(["--smoke", "--in-process", "--model", tiny_smol, "--out", str(out), "--seeds", "0",
                     "--set", QV]) == 0
  res = json.loads((out / "results.json").read_text())
  assert set(res["runs"]) == set(luffy.METHODS) == set(res["final"])
  hist = {m: json.loads((out / "runs" / f"{m}-0" / "history.json").read_text()) for m in luffy.METHODS}
  assert all("sft_loss" in h and "reward_mean" not in h for h in hist["sft"] if h["step"] > 0)  # SFT only
  assert "sft_loss" in hist["sft_rl"][0] and "reward_mean" in hist["sft_rl"][1]  # SFT, then RL
  assert all("off_policy_prob" in h for h in hist["luffy"] if h["step"] > 0)
  assert not any("sft_loss" in h for h in hist["rl"] + hist["luffy"])
  final = res["final"]["luffy_noshape"][0]
  for key in ("eval_accuracy", "eval_pass_at_2", "eval_ood_ops_accuracy", "eval_ood_phrasing_pass_at_2",
              "eval_sample_entropy"):
    assert 0 <= final[key] < float("inf"), key
  md = (out / "RESULTS.md").read_text()
  assert all(f"| {m} | " in md for m in luffy.METHODS) and "### Final evaluation (test split" in md
  assert {"curves.png", "pass_at_k.png", "entropy.png", "length.png", "train_entropy.png"} <= {
      p.name for p in out.iterdir()}


@pytest.mark.long
def test_search_r1_vs_rag_and_combined_smoke(tiny_smol, tmp_path):
  out = tmp_path / "sr1"
  argv = ["--smoke", "--in-process", "--model", tiny_smol, "--out", str(out), "--seeds", "0",
          "--methods", "search_r1", "combined", "--set", QV]
  assert search_r1.main(argv) == 0
  res = json.loads((out / "results.json").read_text())
  assert set(res["runs"]) == {"search_r1", "combined"}
  base = res["baselines"]["0"]
  assert base["oracle_recall"]["em_2hop"] == base["oracle_recall"]["contains_2hop"]
  assert base["oracle_recall"]["searches_2hop"] == 2.0 and base["rag"]["searches"] == 1.0
  assert {"direct", "rag", "oracle_rag", "search_r1:trained", "combined:trained"} <= set(res["summary"])
  md = (out / "RESULTS.md").read_text()
  assert "| RAG (top-3 of the question, retrieve once) |" in md and "| combined (trained) |" in md
  assert "two-hop target" in md and (out / "em_2hop.png").exists()
