"""Start `python -m fineflax.serve` in a subprocess and wait until it answers (experiments, tests)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request


def spawn_server(argv: list[str], *, env: dict | None = None, log_path=None, cwd=None, timeout: float = 120.0,
                 poll_s: float = 0.2):
  """(Popen, base URL) of `python -m fineflax.serve argv` once GET /health answers; the URL's port is the
  one after `--port` in argv. Output goes to `log_path` (else stderr is kept for the error message).
  RuntimeError, with the log path or the stderr tail, when the server exits or is not up in `timeout` s."""
  log = open(log_path, "w") if log_path else None
  proc = subprocess.Popen([sys.executable, "-m", "fineflax.serve", *argv], env=env, cwd=cwd,
                          stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT if log else subprocess.PIPE,
                          text=True)
  url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
  where = lambda: f"see {log_path}" if log else (proc.stderr.read() or "")[-2000:]
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"the server exited with {proc.returncode}: {where()}")
    try:
      urllib.request.urlopen(url + "/health", timeout=2).read()
      return proc, url
    except OSError:
      time.sleep(poll_s)
  proc.kill()
  raise RuntimeError(f"the server did not answer /health in {timeout:.0f} s: {where()}")


def health(url: str, timeout: float = 10.0) -> dict:
  """The server's GET /health JSON (active rows, waiting, prefill and compile counters)."""
  return json.loads(urllib.request.urlopen(url + "/health", timeout=timeout).read())
