"""The chat server after the main install alone (`pip install -e .`, no [retrieval] extra): `httptools` is not
there, so the HTTP protocol falls back to uvicorn's h11 one and keeps closing silent connections. Here
`httptools` is made unimportable by a package of that name, first on PYTHONPATH, whose import raises."""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from fineflax.testing.serve import free_port, server_argv, tiny_chat_model
from fineflax.serve.spawn import spawn_server

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def no_httptools_env(tmp_path_factory):
  """os.environ with a PYTHONPATH on which `import httptools` raises ModuleNotFoundError, then this checkout."""
  blocker = tmp_path_factory.mktemp("no_httptools")
  (blocker / "httptools").mkdir()
  (blocker / "httptools" / "__init__.py").write_text(
      "raise ModuleNotFoundError(\"No module named 'httptools'\", name='httptools')\n")
  return dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), str(ROOT), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.fast
def test_protocol_falls_back_to_h11_when_httptools_is_missing(no_httptools_env):
  code = ("from retrieval.asgi import idle_timeout_protocol\n"
          "print(idle_timeout_protocol(1.0).__mro__[1].__name__)\n")
  r = subprocess.run([sys.executable, "-c", code], env=no_httptools_env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip() == "H11Protocol"
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and r.stdout.strip() == "HttpToolsProtocol", r.stderr[-2000:]  # the [all] install


def test_chat_server_answers_and_closes_silent_connections_without_httptools(tmp_path, no_httptools_env):
  port = free_port()
  argv = server_argv(tiny_chat_model(tmp_path), {}, tmp_path / "log.sqlite", port, "--quant", "none",
                     "--context", "64", "--idle-timeout", "1")
  proc, url = spawn_server(argv, env=no_httptools_env, cwd=ROOT, timeout=240)
  try:
    body = json.dumps({"model": "tiny", "max_tokens": 3, "temperature": 0,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
      out = json.loads(r.read())
    assert r.status == 200 and out["object"] == "chat.completion" and out["usage"]["completion_tokens"] >= 1
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # half a request, then silence
      s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
      start = time.perf_counter()
      assert s.recv(1024) == b""  # EOF: closed by the idle watch (1 s), not by the 10 s socket timeout
      assert 0.5 < time.perf_counter() - start < 8.0
  finally:
    proc.terminate()
    proc.wait(timeout=60)
