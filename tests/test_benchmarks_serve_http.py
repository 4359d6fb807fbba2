"""benchmarks/serve_http.py: the stub engine streams what a decode chunk would, and a level on the real app counts
its requests, tokens and the event loop's CPU."""
import json
import threading
import time

import pytest


class _Job:
  def __init__(self):
    self.events, self.cancelled, self.done = [], False, threading.Event()

  def emit(self, ev):
    self.events.append(ev)
    if ev[0] == "done":
      self.done.set()


@pytest.mark.fast
def test_stub_engine_gives_each_job_its_deltas_then_its_end():
  from benchmarks.serve_http import StubEngine
  engine = StubEngine(tokenizer=None, tick_s=0.001, deltas=3, words=4)
  jobs = [_Job() for _ in range(3)]
  engine.start()
  try:
    for job in jobs[:2]:
      engine.submit(job)
    jobs[2].cancelled = True
    engine.submit(jobs[2])
    assert all(job.done.wait(5) for job in jobs[:2])
    time.sleep(0.02)
  finally:
    engine.stop()
  for job in jobs[:2]:
    assert job.events == [("delta", 0, " word" * 4, [])] * 3 + [("done", 0, "length", 12)]
  assert jobs[2].events == [] and engine.requests == 3 and engine.active_rows() == 0


def test_a_level_on_the_real_app_counts_requests_tokens_and_loop_cpu(tmp_path):
  from benchmarks import serve_http
  serve_http.main(["--clients", "2", "--rounds", "2", "--tick-ms", "2", "--new-tokens", "16", "--deltas", "4",
                   "--client-procs", "1", "--out", str(tmp_path)])
  row, = json.loads((tmp_path / "serve_http.json").read_text())["rows"]
  assert row["requests"] == 4 and row["tok_s"] > 0 and row["loop_cpu_ms_req"] >= 0
  if row["loop_cpu_ms_req"] > 0:
    assert row["front_end_ceiling_tok_s"] == pytest.approx(16 / (row["loop_cpu_ms_req"] / 1e3))
  assert "| 2 |" in (tmp_path / "serve_http.md").read_text()


@pytest.mark.fast
def test_new_tokens_must_split_into_the_deltas():
  from benchmarks.serve_http import parse_args
  with pytest.raises(SystemExit):
    parse_args(["--new-tokens", "10", "--deltas", "4"])


@pytest.mark.fast
def test_publish_writes_json_md_and_the_results_section(tmp_path, monkeypatch):
  from benchmarks import _results
  monkeypatch.setattr(_results, "RESULTS", tmp_path / "RESULTS.md")
  monkeypatch.setattr(_results.write_section, "__defaults__", (tmp_path / "RESULTS.md", _results._HEADER))
  _results.publish(tmp_path, "b", {"x": 1}, "| t |\n", ("b-sec", "## B"))
  assert json.loads((tmp_path / "b.json").read_text()) == {"x": 1} and (tmp_path / "b.md").read_text() == "| t |\n"
  text = (tmp_path / "RESULTS.md").read_text()
  assert "<!-- b-sec:start -->\n## B\n\n| t |\n<!-- b-sec:end -->" in text
  _results.publish(tmp_path, "c", {}, "md")
  assert (tmp_path / "RESULTS.md").read_text() == text  # no section asked: RESULTS.md untouched
