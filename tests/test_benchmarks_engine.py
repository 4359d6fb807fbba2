"""benchmarks/engine.py --tiny: every case runs on the CPU and writes its table as it ends (case b against a
baseline fineflax imported from --baseline-path, here this checkout); the analytic pieces are right."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from benchmarks.engine import response_lengths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_response_lengths_are_a_capped_log_normal():
  n = response_lengths(4000, median=512, cap=4096, sigma=1.0)
  assert max(n) == 4096 and min(n) >= 1 and abs(np.median(n) - 512) < 40
  assert 0.005 < np.mean(np.array(n) == 4096) < 0.04  # P(z > ln 8) = 1.9%


@pytest.mark.long
def test_tiny_run_writes_every_case(tmp_path):
  out = tmp_path / "out"
  r = subprocess.run([sys.executable, "-m", "benchmarks.engine", "--tiny", "--attention", "gather", "--out", str(out),
                      "--baseline-path", ROOT, "--baseline-runs", "1"],
                     cwd=ROOT, capture_output=True, text=True, timeout=1200)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  assert "device: " in r.stdout
  for name in ("engine_a_gather", "engine_b_gather", "engine_c"):
    md = (out / f"{name}.md").read_text()
    assert "error" not in md, md
  a = json.loads((out / "engine_a_gather.json").read_text())["result"]
  assert [(row["attention"], row["room"]) for row in a["rows"]] == [("gather", 256), ("gather", 64)]
  b = json.loads((out / "engine_b_gather.json").read_text())
  assert b["baseline"]["fineflax"].startswith(ROOT) and b["baseline"]["steps"] == max(b["result"]["lengths"])
  c = {row["mode"]: row for row in json.loads((out / "engine_c.json").read_text())["result"]["rows"]}
  assert c["shared"]["prefill_tokens"] * 4 == c["unshared"]["prefill_tokens"] == 16 * 39
  assert c["shared"]["prompt_pages"] < c["unshared"]["prompt_pages"]


def test_tiny_tp_case_splits_the_weights_and_times_a_decode(tmp_path):
  out = tmp_path / "out"
  r = subprocess.run([sys.executable, "-m", "benchmarks.engine", "--tiny", "--only", "tp", "--attention", "gather",
                      "--tp-nf4-kernel", "xla,pallas,kmajor", "--out", str(out)], cwd=ROOT, capture_output=True,
                     text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  res = json.loads((out / "engine_tp_gather_nf4.json").read_text())["result"]
  assert res["devices"] == 2 and res["quant"] == "nf4"
  assert res["device_weight_bytes"] < 0.6 * res["weight_bytes"]  # split, not replicated (norms are)
  # every NF4 product path, one call (kmajor: the K-major layout's shards; on CPU auto multiplies them by XLA)
  assert [row.get("nf4_kernel") for row in res["rows"]] == ["xla", "pallas", "auto+kmajor"]
  for row in res["rows"]:
    assert "error" not in row, row
    assert row["steps"] == 16 and row["ms_step"] > 0 and len(row["peak_gib"]) == 2
  text = (out / "engine_tp_gather_nf4.md").read_text()
  assert "weight read a device" in text and "gather, NF4 pallas" in text


def test_tiny_long_tail_compares_reserving_and_watermark_admission(tmp_path):
  """Case b's default pairs on the CPU, 8-step chunks: the reserving admission with the whole-reserve pool,
  the watermark's with 16 pages (below the 20 live at the peak): it preempts, and every row still ends at
  its drawn length (the worker asserts it); the table names both."""
  out = tmp_path / "out"
  r = subprocess.run([sys.executable, "-m", "benchmarks.engine", "--tiny", "--only", "b", "--attention", "gather",
                      "--chunk-size", "8", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  rows = json.loads((out / "engine_b_gather.json").read_text())["result"]["rows"]
  assert [(row["admission"], row["pool_pages"]) for row in rows] == [("reserve", 52), ("watermark", 16)], rows
  assert rows[0]["preemptions"] == 0 and rows[1]["preemptions"] > 0 and rows[1]["recomputed_tokens"] > 0
  assert rows[1]["peak_pages"] <= 15 and rows[0]["peak_rows"] == 16
  assert "rows in flight peak / mean" in (out / "engine_b_gather.md").read_text()


def test_chunk_ms_splits_a_decode_chunk_per_call_and_per_gap():
  from benchmarks._engine_tables import _dispatch_note, chunk_ms, chunk_ms_cell
  delta = {"dispatch_s": 0.002, "wait_s": 0.010, "gap_s": 0.003, "decode_calls": 4, "gaps": 3}
  ms = chunk_ms(delta)
  assert ms == pytest.approx({"dispatch_ms_chunk": 0.5, "wait_ms_chunk": 2.5, "gap_ms_chunk": 1.0})
  assert chunk_ms_cell(ms) == "0.50 / 2.50 / 1.00"
  assert _dispatch_note(delta).endswith(": 0.50 / 2.50 / 1.00") and _dispatch_note({"decode_calls": 4}) == ""
  assert chunk_ms(dict.fromkeys(delta, 0)) == {"dispatch_ms_chunk": 0, "wait_ms_chunk": 0, "gap_ms_chunk": 0}


def test_thread_cpu_ms_gives_each_server_thread_and_the_rest_a_chunk():
  import os
  import threading
  from benchmarks._engine_tables import thread_cpu_ms
  from benchmarks.retrieval_load import cpu_seconds
  ms = thread_cpu_ms({"fineflax-engine": 0.02, "fineflax-emit": 0.01, "MainThread": 0.03, "fineflax-log": 1.0},
                     total=0.1, chunks=10)
  assert ms == pytest.approx({"engine": 2.0, "emit": 1.0, "loop": 3.0, "other": 4.0})
  assert list(ms) == ["engine", "emit", "loop", "other"]  # the table's order
  split = thread_cpu_ms({"engine:fineflax-engine": 0.02, "engine:fineflax-emit": 0.01, "engine:MainThread": 0.05,
                         "api0:MainThread": 0.03, "api1:MainThread": 0.01, "api0:fineflax-link": 0.01},
                        total=0.2, chunks=10)  # front ends in processes of their own: loops summed, host main is other
  assert split == pytest.approx({"engine": 2.0, "emit": 1.0, "loop": 4.0, "other": 13.0})
  stop = threading.Event()
  def spin():
    while not stop.is_set():
      sum(i * i for i in range(10_000))
  threads = [threading.Thread(target=spin), threading.Thread(target=stop.wait)]
  for t in threads:
    t.start()
  try:
    before = [cpu_seconds(os.getpid(), t.native_id) for t in threads]
    time.sleep(0.6)
    used = [cpu_seconds(os.getpid(), t.native_id) - b for t, b in zip(threads, before)]
  finally:
    stop.set()
    for t in threads:
      t.join()
  assert used[0] > 0.05 and used[1] < 0.02  # the spinning thread's CPU, not the waiting one's
