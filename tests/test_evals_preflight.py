"""`python -m fineflax.evals` checks every variant's endpoint or files and the judge's endpoint before any
model loads: an endpoint that is down, a model name it does not serve (the README's A/B line against
`fineflax.serve`), a missing adapter folder are one line and exit 2, not a traceback after the load."""
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fineflax.evals.__main__ import main

pytestmark = pytest.mark.fast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Lists(BaseHTTPRequestHandler):
  """GET /v1/models lists one model, as fineflax.serve does for its base."""

  def do_GET(self):
    body = json.dumps({"object": "list", "data": [{"id": "smollm2-135m-instruct", "object": "model",
                                                   "created": 0, "owned_by": "fineflax"}]}).encode()
    self.send_response(200 if self.path == "/v1/models" else 404)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def log_message(self, *args):
    pass


@pytest.fixture
def lister():
  server = ThreadingHTTPServer(("127.0.0.1", 0), _Lists)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield f"http://127.0.0.1:{server.server_address[1]}/v1"
  server.shutdown()
  server.server_close()


def _closed_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture
def data(tmp_path):
  path = tmp_path / "eval.jsonl"
  path.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "5"}) + "\n")
  return path


def test_a_server_that_is_down_is_one_line_and_exit_2(data, tmp_path):
  url = f"http://127.0.0.1:{_closed_port()}/v1"
  r = subprocess.run([sys.executable, "-m", "fineflax.evals", "--a", f"{url}#base", "--b",
                      "smollm2-135m-instruct", "--data", str(data), "--out", str(tmp_path / "o")],
                     cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
  [line] = r.stderr.strip().splitlines()
  assert line.startswith(f"error: --a {url}#base: cannot connect (") and line.endswith("is the server running?")
  assert not (tmp_path / "o").exists()


def test_an_unserved_model_a_missing_adapter_and_a_down_judge_are_named(lister, data, tmp_path, capsys):
  out = ["--data", str(data), "--out", str(tmp_path / "o")]
  cases = [(["--a", f"{lister}#base", "--b", f"{lister}#smollm2-135m-instruct"],
            f"error: --a {lister}#base: the endpoint serves no model 'base' (served: smollm2-135m-instruct)"),
           (["--a", f"{lister}#smollm2-135m-instruct", "--b", f"smollm2-135m-instruct+{tmp_path}/nope"],
            f"error: --b smollm2-135m-instruct+{tmp_path}/nope: {tmp_path}/nope: no adapter_config.json"),
           (["--variant", f"{lister}#smollm2-135m-instruct", "--variant", f"{tmp_path}/model.gguf"],
            f"error: --variant {tmp_path}/model.gguf: '{tmp_path}/model.gguf': no such file or folder"),
           (["--a", f"{lister}#smollm2-135m-instruct", "--b", f"{lister}#smollm2-135m-instruct",
             "--judge-url", f"http://127.0.0.1:{_closed_port()}/v1", "--judge-model", "judge"],
            "--judge-model judge: cannot connect (")]
  for argv, message in cases:
    assert main([*argv, *out]) == 2, argv
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
  assert not (tmp_path / "o").exists()
