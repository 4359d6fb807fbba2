"""The benchmark runner: avg@n / pass@n against NumPy on recorded correctness, the table on the shipped
samples, resuming a stopped run, and refusing a rerun with other settings."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fineflax.data.sources import SAMPLES_DIR
from fineflax.evals import bench
from fineflax.evals.benchmarks import benchmark_of, discover
from fineflax.stats import avg_at_n, pass_at_k


def numpy_pass_at_k(correct: np.ndarray, k: int) -> np.ndarray:
  """Codex paper, Chen et al. 2021: pass@k = 1 - C(n - c, k) / C(n, k) per problem."""
  n = correct.shape[1]
  return np.array([1.0 - math.comb(n - int(c), k) / math.comb(n, k) for c in correct.sum(1)])


@pytest.mark.fast
@pytest.mark.parametrize("n,k", [(1, 1), (4, 1), (8, 3), (8, 8), (16, 5)])
def test_pass_at_k_is_the_unbiased_estimator(n, k):
  correct = np.random.default_rng(n * 10 + k).random((50, n)) < 0.3
  np.testing.assert_allclose(pass_at_k(correct, k), numpy_pass_at_k(correct, k), rtol=1e-12, atol=1e-12)
  assert avg_at_n(correct) == pytest.approx(correct.mean())


@pytest.mark.fast
def test_summary_equals_numpy_on_recorded_correctness():
  rng = np.random.default_rng(0)
  correct = {"aime24": rng.random((7, 4)) < 0.4, "nq": rng.random((5, 4)) < 0.6}
  records, rows = [], {}
  for name, c in correct.items():
    rows[name] = [type("Row", (), {"where": f"f:row {i}"})() for i in range(len(c))]
    for i, row in enumerate(c):
      for j in reversed(range(4)):  # any order in the file
        records.append({"benchmark": name, "row": f"f:row {i}", "sample": j, "correct": bool(row[j]),
                        "length": 10 + j, "finish": "eos"})
  records.append({"benchmark": "nq", "row": "f:row 0", "sample": 0, "correct": not correct["nq"][0, 0],
                  "length": 1, "finish": "length"})  # a regenerated sample replaces the earlier record
  correct["nq"][0, 0] = not correct["nq"][0, 0]
  s = bench.summarize(records, rows, 4)
  for name, c in correct.items():
    assert s[name]["avg_at_n"]["value"] == pytest.approx(c.mean())
    assert s[name]["pass_at_n"]["value"] == pytest.approx(numpy_pass_at_k(c, 4).mean())
    assert s[name]["pass_at_n"]["value"] == pytest.approx(c.any(1).mean())
    assert s[name]["avg_at_n"]["lo"] <= s[name]["avg_at_n"]["value"] <= s[name]["avg_at_n"]["hi"]
  assert s["average"]["avg_at_n"] == pytest.approx(np.mean([c.mean() for c in correct.values()]))


@pytest.mark.fast
def test_benchmarks_are_found_by_data_source():
  found = discover([SAMPLES_DIR])
  assert {k: v[0].name for k, v in found.items()} == {
      "aime24": "luffy_valid.parquet", "amc23": "luffy_valid.parquet", "math500": "luffy_valid.parquet",
      "minerva": "luffy_valid.parquet", "olympiadbench": "luffy_valid.parquet", "nq": "search_r1_test.parquet",
      "hotpotqa": "search_r1_test.parquet", "gsm8k": "gsm8k_test.jsonl", "hendrycks_math": "math_test.jsonl"}
  assert benchmark_of("AIME") == "aime24" and benchmark_of("openr1") is None


@pytest.mark.fast
def test_grading_follows_the_papers():
  example = {"ground_truth": "204", "data_source": "aime"}
  assert bench.grade("aime24", "...<|im_start|>assistant\n", "so \\boxed{204}", example, "auto")
  assert not bench.grade("aime24", "...assistant\n<think>\n", "so \\boxed{204}", example, "auto")  # no </think>
  assert bench.grade("aime24", "...assistant\n<think>\n", "hm</think> \\boxed{204}", example, "auto")
  qa = {"ground_truth": ["Lena Sul"], "data_source": "nq"}
  assert bench.grade("nq", "q", "<answer> lena sul. </answer>", qa, "auto")
  assert not bench.grade("nq", "q", "Lena Sul", qa, "auto")  # no <answer>: 0, as qa_em


def _args(model, out, *extra):
  return ["--model", model, "--benchmarks", "aime24,gsm8k,nq", "--data-dir", str(SAMPLES_DIR), "--n", "2",
          "--temperature", "0.7", "--top-p", "0.95", "--max-new-tokens", "6", "--batch-size", "8",
          "--out", str(out), *extra]


@pytest.mark.long
def test_bench_prints_the_table_and_resumes(tiny_smol, tmp_path, capsys):
  out = tmp_path / "bench"
  assert bench.main(_args(tiny_smol, out)) == 0
  printed = capsys.readouterr()
  assert "13 rows to generate (0 already done) x 2 samples" in printed.err
  assert "| benchmark | rows | avg@2 (95% CI) | pass@2 (95% CI) |" in printed.out
  for name, rows in (("aime24", 2), ("gsm8k", 8), ("nq", 3)):
    assert f"| {name} | {rows}/{rows} |" in printed.out
  lines = (out / "generations.jsonl").read_text().splitlines()
  assert len(lines) == 13 * 2
  result = json.loads((out / "results.json").read_text())
  t = result["timing"]  # the engine steps are part of the loop's time; the default grading processes ran
  assert 0 < t["engine_seconds"] + t["host_seconds"] <= t["seconds"] and t["grade_workers"] == bench.default_grade_workers()
  first = _completions(out)
  recs = [json.loads(x) for x in lines]
  for name in ("aime24", "gsm8k", "nq"):
    c = np.array([[r["correct"] for r in recs if r["benchmark"] == name and r["row"] == row]
                  for row in dict.fromkeys(r["row"] for r in recs if r["benchmark"] == name)])
    assert result["summary"][name]["avg_at_n"]["value"] == pytest.approx(c.mean())
  # a run stopped during its writes: 9 complete lines (the fifth row has 1 of its 2 samples), then a cut line
  (out / "generations.jsonl").write_text("\n".join(lines[:9]) + "\n" + lines[9][:20])
  assert bench.main(_args(tiny_smol, out, "--grade-workers", "0")) == 0  # grading in line this time
  printed = capsys.readouterr()
  assert "9 rows to generate (4 already done) x 2 samples" in printed.err
  recs = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
  assert len(recs) == 9 + 9 * 2 and len(bench.completed(recs, 2)) == 13
  assert "| gsm8k | 8/8 |" in printed.out
  assert _completions(out) == first  # per-row keys: the resumed rows got the samples of the first run
  # nothing left: a third run generates nothing; other settings are refused
  assert bench.main(_args(tiny_smol, out)) == 0
  assert "0 rows to generate (13 already done)" in capsys.readouterr().err
  assert bench.main(_args(tiny_smol, out)[:-2] + ["--out", str(out), "--seed", "1"]) == 2
  assert "other settings {'seed': (0, 1)}" in capsys.readouterr().err


@pytest.mark.fast
@pytest.mark.fast
@pytest.mark.parametrize("cpus,workers", [(1, 1), (2, 1), (4, 2), (16, 8), (64, 8)])
def test_default_grade_workers_leave_two_cpus(cpus, workers):
  assert bench.default_grade_workers(cpus) == workers


def test_user_mistakes_exit_2(tmp_path, capsys):
  assert bench.main(_args("unused", tmp_path / "a")[:2] + ["--benchmarks", "aime2024", "--out", str(tmp_path)]) == 2
  assert "unknown benchmark(s) ['aime2024']" in capsys.readouterr().err
  assert bench.main(["--model", "unused", "--benchmarks", "aime25", "--data-dir", str(SAMPLES_DIR),
                     "--out", str(tmp_path / "b")]) == 2
  assert "no file holds benchmark(s) ['aime25']" in capsys.readouterr().err
  assert bench.main(["--model", "m", "--benchmarks", "nq", "--n", "4", "--out", str(tmp_path / "c")]) == 2
  assert "--n > 1 needs --temperature > 0" in capsys.readouterr().err


def _completions(out) -> dict:
  return {(r["row"], r["sample"]): (r["completion"], r["finish"], r["length"])
          for r in map(json.loads, (out / "generations.jsonl").read_text().splitlines())}


@pytest.mark.long
def test_batching_changes_no_completion(tiny_smol, tmp_path):
  """One engine, slots refilled in waves (--admit) or fixed batches (--admit = --batch-size), other batch
  sizes: each row's completions are drawn with its own keys, so greedy and sampled text stay the same."""
  base = ["--model", tiny_smol, "--benchmarks", "gsm8k", "--data-dir", str(SAMPLES_DIR), "--max-new-tokens", "6",
          "--grade-workers", "0"]
  for sampling in (["--n", "1", "--temperature", "0"], ["--n", "2", "--temperature", "0.8", "--top-p", "0.9"]):
    texts = []
    for batch, admit in ((4, 4), (4, 2), (6, 2), (8, 8)):
      out = tmp_path / f"b{batch}a{admit}{sampling[1]}"
      assert bench.main([*base, *sampling, "--batch-size", str(batch), "--admit", str(admit), "--out", str(out)]) == 0
      texts.append(_completions(out))
      timing = json.loads((out / "results.json").read_text())["timing"]
      assert timing["live"] == batch and timing["wave"] == admit
    assert len(texts[0]) == 8 * int(sampling[1]) and all(t == texts[0] for t in texts[1:])
