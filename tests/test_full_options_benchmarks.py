"""benchmarks/memory_plan_check.py and benchmarks/sft_full_options.py without a GPU: the estimate is the memory
plan of the case's settings, and the reports compute their ratios from the rows (a failed case is a row)."""
import pytest

from benchmarks import memory_plan_check as mpc
from benchmarks import sft_full_options as sfo
from fineflax.jobs.memory_plan import GIB, PlanInputs, update_phase

pytestmark = pytest.mark.fast


def test_the_check_estimates_each_case_with_its_own_settings():
  full, bf16, lora = (mpc.estimate(mpc.spec_of(k, mpc.CASES[k])) for k in list(mpc.CASES)[:3])
  p = mpc.sft.model_config(mpc.spec_of("x", mpc.CASES[list(mpc.CASES)[0]])).num_params()
  assert full["optimizer"] == pytest.approx(8 * p, abs=16) and bf16["optimizer"] == pytest.approx(4 * p, abs=16)
  assert "base_weights" in lora and "base_weights" not in full
  spec = mpc.spec_of("3B", mpc.CASES["3B full, remat full, f32 moments"])
  want = update_phase(PlanInputs(model=mpc.sft.model_config(spec), n_devices=1, fsdp=1, params="full", remat="full",
                                 update_rows=4, prompt_tokens=2048, logits_chunk=mpc.CHUNK,
                                 micro_key="train.micro_batch_tokens"))
  assert mpc.estimate(spec) == want


def test_the_check_reports_ratio_and_verdict():
  spec = mpc.spec_of("a", mpc.SMOKE["tiny full"])
  terms = {"parameters": 10 * GIB}
  md = mpc.report([dict(spec, terms=terms, peak_bytes=9 * GIB), dict(spec, model="b", terms=terms, peak_bytes=8 * GIB),
                   dict(spec, model="c", terms=terms, peak_bytes=None, error="oom")], "gpu", "cmd")
  assert "| a | 2 x 64 | 10.00 | 9.00 | 1.111 | yes |" in md and "| b | 2 x 64 | 10.00 | 8.00 | 1.250 | **no** |" in md
  assert "| c | 2 x 64 | 10.00 | oom | n/a | n/a |" in md


def test_the_options_table_divides_by_eager_and_torch_compile():
  s = sfo.specs(False, 8, 2)
  rows = {k: dict(s[k], seconds=1.0, tokens_s=t, peak_bytes=g * GIB) for k, t, g in
          ((sfo.EAGER, 1000.0, 20), (sfo.COMPILED, 2000.0, 10), (list(s)[2], 3000.0, 13))}
  rows[list(s)[3]] = dict(s[list(s)[3]], error="not run: 3 s of the 285 s budget left")
  md = sfo.report(rows, "NVIDIA H200", "cmd")
  line = next(ln for ln in md.splitlines() if ln.startswith(f"| {list(s)[2]} |"))
  assert line.endswith("| 3.00x | 1.50x | 1.30x |") and "| not run: 3 s" in md
