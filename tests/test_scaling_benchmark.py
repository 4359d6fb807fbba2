"""benchmarks/scaling.py's largest-model case with tensor-parallel rollouts (--fits_model): the --tiny run (4
forced CPU devices, fsdp=4, rollouts over model=2) runs one GRPO step with the rollout weights split over the
model axis and reports rollout / update seconds and decode ms a step against the weight-read time."""
import json
import subprocess
import sys

import pytest

from benchmarks import scaling


@pytest.mark.fast
def test_the_tiny_tensor_parallel_shape_splits_over_2_devices_in_nf4():
  from fineflax.engine import tensor_parallel as tp
  mc = scaling._model_config(scaling.TINY_TP, 64)
  tp.check_tp(mc, 2)
  for out in (mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim, mc.intermediate_size):
    assert out % (2 * 64) == 0, out  # NF4 column blocks of 64 per device (quant.column_blocks)


@pytest.mark.long
def test_tiny_70b_case_runs_with_rollouts_tensor_parallel(tmp_path):
  r = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--out", str(tmp_path), "--only", "none",
                      "--fits_fsdp", "4", "--fits_model", "2", "--tiny"], capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  (row,) = [json.loads(l) for l in (tmp_path / "scaling.jsonl").read_text().splitlines()]
  assert "error" not in row, row
  assert row["model"] == "tiny (fsdp=4, model=2)" and row["model_axis"] == 2 and row["devices"] == 4
  assert row["rollout_s"] > 0 and row["update_s"] > 0 and row["decode_ms"] > 0 and row["weight_read_ms"] > 0
  assert row["decode_over_read"] == pytest.approx(row["decode_ms"] / row["weight_read_ms"])
  table = (tmp_path / "scaling.md").read_text()
  assert "model=2" in table and "ms/step" in table and "the weight read" in table
