"""experiments/report.py: the committed README / RESULTS.md blocks equal what the committed results.json files
give (a hand edit fails), and its statistics agree with independent computations."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from scipy import stats

from experiments import report
from fineflax.runs import paired_test

pytestmark = pytest.mark.fast


def test_committed_blocks_are_generated_from_the_results_files():
  assert report.main(["--check"]) == 0


def test_a_hand_edited_block_is_caught(tmp_path, monkeypatch):
  rel, make = report.BLOCKS["exgrpo"]
  text = (report.ROOT / rel).read_text()
  edited = text.replace(make(), make().replace("GRPO (step", "GRPO (step 9", 1))
  assert edited != text
  (tmp_path / rel).parent.mkdir(parents=True)
  (tmp_path / rel).write_text(edited)
  for name in ("results.json", "results_before_issue35.json"):
    (tmp_path / "experiments" / "exgrpo" / name).write_text((report.ROOT / "experiments" / "exgrpo" / name).read_text())
  monkeypatch.setattr(report, "ROOT", tmp_path)
  assert report.main(["--check", "--blocks", "exgrpo"]) == 1
  assert report.main(["--blocks", "exgrpo"]) == 0 and (tmp_path / rel).read_text() == text  # regenerated


def test_paired_test_against_enumeration_and_scipy():
  rng = np.random.default_rng(0)
  for n in (2, 3, 4, 6):
    a, b = rng.uniform(size=n), rng.uniform(size=n)
    t = paired_test(dict(enumerate(a)), dict(enumerate(b)))
    d = a - b
    flips = [abs(np.mean(np.array(s) * d)) for s in itertools.product((1, -1), repeat=n)]
    assert t["signflip_p"] == pytest.approx(np.mean([f >= abs(d.mean()) - 1e-12 for f in flips]))
    ref = stats.permutation_test((a, b), lambda x, y: np.mean(x - y), permutation_type="samples",
                                 n_resamples=np.inf).pvalue
    assert t["signflip_p"] == pytest.approx(ref)
    assert t["t_p"] == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert t["diff"] == pytest.approx(d.mean()) and t["wins"] == int((d > 0).sum())
  assert paired_test({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}, {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0})["signflip_p"] == 0.125
  assert paired_test({0: 1.0}, {1: 1.0})["n"] == 0  # no seed in common


def test_final_step_is_the_last_step_every_run_reached():
  d = report.Data(report.EXPERIMENTS["search_r1_masking"])
  res = json.loads((report.ROOT / report.EXPERIMENTS["search_r1_masking"].results).read_text())
  last = {m: min(max(e["step"] for e in r["evals"]) for r in runs.values()) for m, runs in res["runs"].items()}
  assert d.final_step(d.methods) == min(last.values())
  luffy = report.Data(report.EXPERIMENTS["luffy"])
  step = luffy.final_step(luffy.methods)
  assert luffy.at("sft_rl", step, "eval_accuracy").keys() == luffy.at("rl", step, "eval_accuracy").keys()
  assert all(luffy.evals["sft_rl"][s][step + 50] for s in luffy.seeds)  # sft_rl: 50 SFT steps first


def test_before_after_rows_are_the_difference_of_the_two_files_means():
  exp = report.EXPERIMENTS["search_r1_masking"]
  d = report.Data(exp)
  step = d.final_step(d.methods)
  lines = report.before_after(d, step)
  now, old = (json.loads((report.ROOT / p).read_text()) for p in (exp.results, exp.previous))

  def mean_at(res, method, metric):
    last = min(max(e["step"] for e in run["evals"]) for runs in res["runs"].values() for run in runs.values())
    vals = [e[metric] for run in res["runs"][method].values() for e in run["evals"] if e["step"] == last]
    return sum(vals) / len(vals)

  for method in ("masked", "unmasked"):
    row = next(r for r in lines if r.startswith(f"| {method} | EM |"))
    change = float(row.rsplit("|", 2)[1])
    assert change == pytest.approx(mean_at(now, method, "eval_em") - mean_at(old, method, "eval_em"), abs=1e-3)
  assert any(r.startswith("| masked | EM |") for r in lines) and "final step" in lines[0]
