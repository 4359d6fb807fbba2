"""fineflax.evals: bootstrap CIs, the order-swap logic on scripted judges, and the CLI end to end against a
tiny OpenAI-API stub (http.server on 127.0.0.1) serving two answerers and a judge; the CLI checks every
variant's endpoint or files and the judge's endpoint before any model loads (an endpoint that is down, a model
name it does not serve, a missing adapter folder: one line and exit 2, not a traceback after the load)."""
import json
import os
import re
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from fineflax.evals import judge as J
from fineflax.evals.__main__ import main
from fineflax.evals.harness import EvalDataError, load_eval_set, run_ab
from fineflax.stats import mean_ci, outcome_ci, t_interval
from fineflax.evals.variants import parse_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.fast
def test_bootstrap_matches_the_normal_approximation():
  rng = np.random.default_rng(1)
  o = rng.choice([1, 0, -1], p=[0.5, 0.2, 0.3], size=2000)
  ci = outcome_ci(o, num_resamples=4000, seed=0)
  for k, v in (("win", 1), ("tie", 0), ("loss", -1)):
    p = np.mean(o == v)
    half = 1.96 * np.sqrt(p * (1 - p) / len(o))
    assert ci[k]["value"] == pytest.approx(p)
    assert ci[k]["lo"] == pytest.approx(p - half, abs=0.006) and ci[k]["hi"] == pytest.approx(p + half, abs=0.006)
  assert ci["score"]["value"] == pytest.approx(np.mean(o == 1) + np.mean(o == 0) / 2)
  small = outcome_ci(o[:200], num_resamples=4000, seed=0)
  assert small["win"]["hi"] - small["win"]["lo"] > 2.5 * (ci["win"]["hi"] - ci["win"]["lo"])  # ~ sqrt(10)
  assert outcome_ci([1] * 30)["win"] == {"value": 1.0, "lo": 1.0, "hi": 1.0}
  assert outcome_ci([1, -1], seed=3) == outcome_ci([1, -1], seed=3)  # deterministic
  m = mean_ci([0.0, 1.0] * 50)
  assert m["value"] == 0.5 and m["lo"] < 0.5 < m["hi"]
  with pytest.raises(ValueError, match="outcomes must be -1, 0 or 1"):
    outcome_ci([2, 1])


def _answer_of(text, n):
  return re.search(rf"\[Response {n}\]\n(.*?)\n\[End of Response {n}\]", text, re.S).group(1)


@pytest.mark.fast
@pytest.mark.parametrize("level", [0.95, 0.9])
def test_t_interval_matches_scipy_from_values_and_from_sums(level):
  from scipy import stats
  rng = np.random.default_rng(1)
  for n in (2, 3, 7, 40):
    x = rng.normal(0.3, 0.5, n)
    want = stats.t.interval(level, n - 1, loc=x.mean(), scale=stats.sem(x))
    mean, lo, hi = t_interval(x, level=level)
    assert mean == pytest.approx(x.mean()) and (lo, hi) == pytest.approx(want, rel=1e-9)
    assert t_interval(n=n, total=x.sum(), total_sq=(x * x).sum(), level=level) == pytest.approx((mean, lo, hi),
                                                                                                rel=1e-7)
  assert np.isnan(t_interval([0.5])[1:]).all() and t_interval([0.5])[0] == 0.5
  with pytest.raises(ValueError, match="at least one value"):
    t_interval([])


@pytest.mark.fast
def test_order_swap_cancels_position_bias():
  calls = []

  def always_first(messages):
    calls.append(messages[-1]["content"])
    return "Response 1 is better. [[1]]"
  out = J.judge_pair(always_first, [{"role": "user", "content": "q"}], "answer A", "answer B")
  assert out == {"outcome": 0, "verdicts": ["1", "1"], "votes": [1, -1]}
  assert _answer_of(calls[0], 1) == "answer A" and _answer_of(calls[1], 1) == "answer B"  # both orders asked

  def prefers_longer(messages):
    t = messages[-1]["content"]
    return "[[1]]" if len(_answer_of(t, 1)) > len(_answer_of(t, 2)) else "[[2]]"
  p = [{"role": "user", "content": "q"}]
  assert J.judge_pair(prefers_longer, p, "long answer", "short")["outcome"] == 1
  assert J.judge_pair(prefers_longer, p, "s", "longer")["outcome"] == -1
  tie_then_a = iter(["[[tie]]", "I pick [[2]] (not [[1]])... final: [[2]]"])
  assert J.judge_pair(lambda m: next(tie_then_a), p, "x", "y") == {"outcome": 1, "verdicts": ["tie", "2"],
                                                                   "votes": [0, 1]}
  assert J.parse_verdict("no verdict here") == "invalid" and J.vote_for_a("invalid", True) == 0


@pytest.mark.fast
def test_parse_spec_and_eval_rows(tmp_path):
  assert parse_spec("http://127.0.0.1:8000/v1#smol") == {"kind": "http", "url": "http://127.0.0.1:8000/v1",
                                                         "model": "smol"}
  assert parse_spec("smollm2-135m-instruct+runs/x/adapter") == {"kind": "local", "source": "smollm2-135m-instruct",
                                                                "adapter": "runs/x/adapter"}
  with pytest.raises(ValueError, match="needs a model name after '#'"):
    parse_spec("http://127.0.0.1:8000/v1")
  f = tmp_path / "e.jsonl"
  f.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
               + "\n" + json.dumps({"question": "2+2?", "answer": 4}) + "\n")
  rows = load_eval_set(f)
  assert rows[0]["prompt"] == [{"role": "user", "content": "hi"}] and rows[0]["reference"] == "yo"
  assert rows[1]["reference"] == "4" and rows[1]["example"]["answer"] == 4
  f.write_text('{"question": "a"}\n{"text": "b"}\n')
  with pytest.raises(EvalDataError, match=r"e.jsonl:line 2: no 'messages', 'prompt' or 'question'"):
    load_eval_set(f)


class _Stub(BaseHTTPRequestHandler):
  """POST /v1/chat/completions: model "good" answers a+b, "bad" a+b+1, "judge" picks the response
  that equals the reference answer; GET /v1/models lists the three."""

  def do_GET(self):
    self._send(200 if self.path == "/v1/models" else 404, {"object": "list", "data": [
        {"id": m, "object": "model", "created": 0, "owned_by": "stub"} for m in ("good", "bad", "judge")]})

  def _send(self, status: int, obj: dict):
    body = json.dumps(obj).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def do_POST(self):
    req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    text = req["messages"][-1]["content"]
    if req["model"] == "judge":
      ref = re.search(r"\[Reference answer\]\n(.*?)\n", text).group(1)
      r1, r2 = _answer_of(text, 1), _answer_of(text, 2)
      content = "[[tie]]" if (r1 == ref) == (r2 == ref) else ("[[1]]" if r1 == ref else "[[2]]")
    elif req["model"] in ("good", "bad"):
      a, b = map(int, re.findall(r"\d+", text)[:2])
      content = str(a + b + (req["model"] == "bad"))
    else:
      self.send_response(404)
      self.end_headers()
      return
    self._send(200, {"id": "x", "object": "chat.completion", "created": 0, "model": req["model"],
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": content}}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

  def log_message(self, *args):
    pass


@pytest.fixture
def stub():
  server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield f"http://127.0.0.1:{server.server_address[1]}/v1"
  server.shutdown()
  server.server_close()


def test_cli_end_to_end_against_an_openai_stub(stub, tmp_path, capsys):
  data = tmp_path / "eval.jsonl"
  data.write_text("".join(json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                          for a, b in [(1, 2), (3, 4), (10, 20), (7, 7), (5, 0), (9, 8)]))
  out = tmp_path / "report"
  rc = main(["--a", f"{stub}#good", "--b", f"{stub}#bad", "--data", str(data), "--judge-url", stub,
             "--judge-model", "judge", "--rewards", "math_last_number", "--resamples", "500", "--out", str(out)])
  assert rc == 0
  res = json.loads((out / "results.json").read_text())
  assert res["n"] == 6
  assert res["metrics"]["exact_match_lenient"]["a"]["value"] == 1.0 and res["metrics"]["exact_match_lenient"]["b"]["value"] == 0.0
  assert res["metrics"]["math_last_number"]["a_minus_b"]["value"] == 1.0
  assert res["judge"]["win"] == {"value": 1.0, "lo": 1.0, "hi": 1.0} and res["judge"]["order_disagreements"] == 0
  md = (out / "report.md").read_text()
  assert "![A/B](ab.png)" in md and "| exact_match_lenient | 1.000 [1.000, 1.000]" in md
  assert (out / "ab.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  examples = [json.loads(x) for x in (out / "examples.jsonl").read_text().splitlines()]
  assert examples[0]["a"] == "3" and examples[0]["b"] == "4" and examples[0]["judge"]["verdicts"] == ["1", "2"]
  # swapped: B is the good one -> all losses
  main(["--a", f"{stub}#bad", "--b", f"{stub}#good", "--data", str(data), "--judge-url", stub,
        "--judge-model", "judge", "--resamples", "200", "--out", str(out)])
  assert json.loads((out / "results.json").read_text())["judge"]["loss"]["value"] == 1.0
  assert main(["--a", "http://x/v1", "--b", f"{stub}#good", "--data", str(data)]) == 2
  assert "needs a model name" in capsys.readouterr().err


def _closed_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture
def data(tmp_path):
  path = tmp_path / "eval.jsonl"
  path.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "5"}) + "\n")
  return path


@pytest.mark.fast
def test_a_server_that_is_down_is_one_line_and_exit_2(data, tmp_path):
  url = f"http://127.0.0.1:{_closed_port()}/v1"
  r = subprocess.run([sys.executable, "-m", "fineflax.evals", "--a", f"{url}#base", "--b",
                      "smollm2-135m-instruct", "--data", str(data), "--out", str(tmp_path / "o")],
                     cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
  [line] = r.stderr.strip().splitlines()
  assert line.startswith(f"error: --a {url}#base: cannot connect (") and line.endswith("is the server running?")
  assert not (tmp_path / "o").exists()


@pytest.mark.fast
def test_an_unserved_model_a_missing_adapter_and_a_down_judge_are_named(stub, data, tmp_path, capsys):
  out = ["--data", str(data), "--out", str(tmp_path / "o")]
  cases = [(["--a", f"{stub}#base", "--b", f"{stub}#good"],
            f"error: --a {stub}#base: the endpoint serves no model 'base' (served: good, bad, judge)"),
           (["--a", f"{stub}#good", "--b", f"smollm2-135m-instruct+{tmp_path}/nope"],
            f"error: --b smollm2-135m-instruct+{tmp_path}/nope: {tmp_path}/nope: no adapter_config.json"),
           (["--variant", f"{stub}#good", "--variant", f"{tmp_path}/model.gguf"],
            f"error: --variant {tmp_path}/model.gguf: '{tmp_path}/model.gguf': no such file or folder"),
           (["--a", f"{stub}#good", "--b", f"{stub}#good",
             "--judge-url", f"http://127.0.0.1:{_closed_port()}/v1", "--judge-model", "judge"],
            "--judge-model judge: cannot connect (")]
  for argv, message in cases:
    assert main([*argv, *out]) == 2, argv
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
  assert not (tmp_path / "o").exists()
