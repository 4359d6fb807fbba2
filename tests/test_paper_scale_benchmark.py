"""benchmarks/paper_scale.py: the projection is the stated formula, the flags reach the specs, and `--tiny`
runs both recipes end to end through the real Learner (slow: two subprocess steps on forced CPU devices)."""
import json
import subprocess
import sys

import pytest

from benchmarks import paper_scale as ps

FAST = pytest.mark.fast


def _spec(recipe, **kw):
  return dict(ps.TINY_DEFAULTS[recipe], recipe=recipe, tiny=True, steps=2, critic="full", **kw)


def _result(rollout, update, devices=2):
  step = dict(rollout_s=rollout, update_s=update, mean_tokens=10.0, max_tokens=16, turns=None, searches=None,
              loss=0.5, rows=8)
  return {"steps": [dict(step, rollout_s=90.0, update_s=80.0), step], "devices": devices, "peak_gib": 3.0}


@FAST
def test_projection_is_steps_times_step_seconds_scaled_by_rows_and_devices():
  row = ps.summarize(_spec("luffy"), _result(rollout=30.0, update=10.0, devices=4))
  paper = ps.PAPER["luffy"]
  # 500 steps x 40 s x (128 x 8) / (2 x 4) rows x (4 / 8) devices / 3600
  assert row["projected_h"] == pytest.approx(500 * 40.0 * (128 * 8) / 8 * 0.5 / 3600)
  assert row["scale"] == pytest.approx(paper["prompts"] * paper["group"] / 8)
  assert (row["rollout_s"], row["first_rollout_s"], row["first_update_s"]) == (30.0, 90.0, 80.0)  # the last step
  assert "500 steps x 40.0 s x (128 x 8) / (2 x 4) x (4 / 8) / 3600" == row["formula"]


@FAST
def test_report_has_every_column_and_names_a_failed_recipe():
  ok = ps.summarize(_spec("luffy"), _result(1.0, 2.0))
  bad = {"recipe": "search_r1_ppo", "spec": _spec("search_r1_ppo"), "error": "timed out after 470s"}
  md = ps.report([ok, bad], "gpu", "python -m benchmarks.paper_scale", tiny=False)
  header = next(line for line in md.splitlines() if line.startswith("| recipe"))
  assert [c.strip() for c in header.strip("|").split("|")] == ps.COLUMNS
  body = [line for line in md.splitlines() if line.startswith("| luffy") or line.startswith("| search_r1")]
  assert all(line.count("|") == len(ps.COLUMNS) + 1 for line in body)
  assert "error: timed out after 470s" in body[1]


@FAST
def test_flags_override_the_defaults_of_each_recipe():
  args = ps.argparse.Namespace(recipe=["luffy", "search_r1_ppo"], tiny=False, prompts=4, samples=None, median=None,
                               sigma=None, max_new_tokens=8192, prompt_len=None, micro_batch_tokens=None,
                               critic="lora", steps=1)
  luffy, ppo = ps.specs(args)
  assert (luffy["prompts"], luffy["max_new_tokens"], luffy["samples"]) == (4, 8192, 8)
  assert (ppo["prompts"], ppo["samples"], ppo["critic"]) == (4, 5, "lora")
  config = ps.paper_config(dict(ppo, tiny=False))
  assert (config.rl.prompts_per_step, config.rl.mini_batch_size, config.rl.ppo.critic) == (4, 2, "lora")
  assert config.search.url == ""  # the in-process engine, not the paper's retriever server


@FAST
def test_a_later_call_keeps_the_other_recipes_rows_of_the_same_mode(tmp_path):
  rows = [ps.summarize(_spec("luffy"), _result(1.0, 2.0)), ps.summarize(_spec("search_r1_ppo"), _result(3.0, 4.0))]
  ps.write_outputs(tmp_path, rows, "cpu", "cmd", tiny=True, results=False)
  assert [r["recipe"] for r in ps.earlier_rows(tmp_path, ["luffy"], tiny=True)] == ["search_r1_ppo"]
  assert ps.earlier_rows(tmp_path, ["luffy"], tiny=False) == []  # GPU rows never mix with tiny ones
  assert ps.earlier_rows(tmp_path / "none", ["luffy"], tiny=True) == []


@pytest.mark.slow
def test_tiny_runs_both_recipes_one_call_each_and_writes_the_table_and_json(tmp_path):
  out = tmp_path / "out"
  for recipe in ("luffy", "search_r1_ppo"):  # the second call keeps the first one's row
    proc = subprocess.run([sys.executable, "-m", "benchmarks.paper_scale", "--tiny", "--recipe", recipe,
                           "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
  header = next(line for line in proc.stdout.splitlines() if line.startswith("| recipe"))
  assert [c.strip() for c in header.strip("|").split("|")] == ps.COLUMNS
  assert (out / "paper_scale.md").read_text().strip() in proc.stdout
  data = json.loads((out / "paper_scale.json").read_text())
  rows = {r["recipe"]: r for r in data["rows"]}
  assert set(rows) == {"luffy", "search_r1_ppo"}
  for name, r in rows.items():
    assert set(ps.JSON_FIELDS) <= set(r), name
    spec = ps.TINY_DEFAULTS[name]
    assert r["rows"] == spec["prompts"] * spec["samples"] and r["devices"] == ps.TINY_DEVICES
    assert r["rollout_s"] > 0 and r["update_s"] > 0 and r["projected_h"] > 0
  assert rows["luffy"]["max_tokens"] <= ps.TINY_DEFAULTS["luffy"]["max_new_tokens"]
  assert rows["search_r1_ppo"]["turns"] >= 1  # the env's multi-turn loop ran


def _luffy_gpu(**kw):
  return dict(ps.GPU_DEFAULTS["luffy"], recipe="luffy", tiny=False, steps=1, critic="full", fit=True, **kw)


@FAST
def test_fit_picks_the_most_prompts_the_plan_fits_and_falls_back_to_a_smaller_shape():
  """`--fit` (issue 46.3): on 2 x 141 GiB the 7B LUFFY shape runs at the largest P whose plan fits (P + 1 does
  not); where the 7B shape fits at no P the row names why in one line and runs a smaller shape; where nothing
  fits, None with one line a shape."""
  from benchmarks._paper_fit import FALLBACK_SHAPES, MARGIN, fit_spec, plan_inputs
  from fineflax.jobs.memory_plan import GIB, fits
  spec = _luffy_gpu(prompts=128, max_new_tokens=8192)
  chosen, notes = fit_spec(spec, ps.paper_config, 2, 141 * GIB)
  p = chosen["prompts"]
  assert 1 <= p < 128 and chosen["model_source"] == "Elliott/Qwen2.5-Math-7B-16k-think"
  budget = MARGIN * 141 * GIB
  assert fits(plan_inputs(ps.paper_config(chosen), 2), budget)
  assert not fits(plan_inputs(ps.paper_config(dict(chosen, prompts=p + 1)), 2), budget)
  assert notes == [f"Elliott/Qwen2.5-Math-7B-16k-think: {p} prompts x 8 rows fit 2 x 126.9 GiB (90% of the device) "
                   "by the plan"]
  small, notes = fit_spec(_luffy_gpu(), ps.paper_config, 2, 40 * GIB)  # 7B full: ~42 GiB of params + moments
  assert small is not None and small["model_source"] in FALLBACK_SHAPES
  assert notes[0].startswith("Elliott/Qwen2.5-Math-7B-16k-think does not fit 2 devices even at 1 prompt: the ")
  assert "\n" not in notes[0]
  none, notes = fit_spec(_luffy_gpu(), ps.paper_config, 2, 1 * GIB)
  assert none is None and len(notes) == 1 + len(FALLBACK_SHAPES)
