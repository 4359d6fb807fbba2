"""Sandbox containment and the code reward (all child processes; nothing runs in-process)."""
import os
import socket
import time

import pytest

from fineflax.rewards import get_reward
from fineflax.rewards import sandbox
from fineflax.rewards.code_reward import split_tests
from fineflax.rewards.sandbox import run_python

ISOLATED = sandbox.isolation_mode() in ("root", "userns")


def test_plain_program_output_and_returncode():
  r = run_python("import sys; print(6 * 7); sys.exit(3)", timeout_s=5)
  assert (r.returncode, r.stdout.strip(), r.timed_out) == (3, "42", False)


def test_infinite_loop_times_out_promptly():
  start = time.monotonic()
  r = run_python("while True: pass", timeout_s=1.0)
  assert r.timed_out and r.returncode != 0
  assert time.monotonic() - start < 1.0 + 2.0


def test_fork_bomb_is_contained():
  start = time.monotonic()
  src = "import os\nn = 0\nwhile True:\n  try:\n    os.fork(); n += 1\n  except OSError:\n    break\nprint('capped', n, flush=True)\n"
  r = run_python(src, timeout_s=3.0, max_processes=16)
  assert "capped" in r.stdout  # fork eventually failed with EAGAIN instead of exhausting the host
  assert time.monotonic() - start < 3.0 + 2.0
  if sandbox.isolation_mode() == "root":  # no live process of any sandbox uid is left
    pids = [p for p in os.listdir("/proc") if p.isdigit() and _uid(p) >= sandbox._UID_BASE]
    assert not [p for p in pids if _state(p) not in ("Z", "X", "")]


def _uid(pid):
  try:
    return os.stat(f"/proc/{pid}").st_uid
  except OSError:
    return -1


def _state(pid):
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0]
  except (OSError, IndexError):
    return ""


def test_memory_limit_raises_memory_error():
  r = run_python("b = bytearray(10 * 1024 ** 3)\nprint('allocated')", timeout_s=5, memory_mb=256)
  assert "allocated" not in r.stdout and "MemoryError" in r.stderr and r.returncode != 0


def test_network_connection_fails():
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    src = (f"import socket\ntry:\n  socket.create_connection(('127.0.0.1', {port}), timeout=2)\n  print('CONNECTED')\n"
           "except OSError as e:\n  print('refused', e)\n")
    r = run_python(src, timeout_s=5)
    server.settimeout(0.2)
    with pytest.raises(socket.timeout):
      server.accept()
  assert "refused" in r.stdout and "CONNECTED" not in r.stdout


@pytest.mark.skipif(not ISOLATED, reason="'rlimits' mode does not prevent writes outside the temp dir")
def test_writes_outside_temp_dir_are_prevented(tmp_path):
  target = tmp_path / "escaped.txt"
  src = f"open('inside.txt', 'w').write('ok')\nopen({str(target)!r}, 'w').write('x')\n"
  r = run_python(src, timeout_s=5)
  assert not target.exists()
  assert "inside.txt" not in r.stderr and ("Read-only" in r.stderr or "Permission" in r.stderr)


def test_code_reward_fraction_of_tests():
  code = get_reward("code")
  completion = "Here:\n```python\ndef add(a, b):\n    return a + b\n```\n"
  tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add(-1, 1) == 0"]
  assert code("", completion, tests=tests) == pytest.approx(2 / 3)
  assert code("", completion, tests="import math\nassert add(1, 1) == 2\nassert add(0, 0) == math.pi\n") == 0.5


def test_code_reward_adversarial_programs_score_zero():
  code = get_reward("code")
  tests = ["assert f() == 1"]
  start = time.monotonic()
  assert code("", "```python\nwhile True: pass\n```", tests=tests, timeout_s=1.0) == 0.0
  assert time.monotonic() - start < 3.0
  assert code("", "```python\nimport sys\nsys.exit(0)\n```", tests=tests) == 0.0
  assert code("", "```python\nimport os\nos._exit(0)\n```", tests=tests) == 0.0
  forged = "```python\nprint('0 0 1')\ndef f():\n    return 2\n```"  # fake result line: no nonce
  assert code("", forged, tests=tests) == 0.0
  assert code("", "```python\ndef f(:\n```", tests=tests) == 0.0


def test_code_reward_humaneval_check_and_partial_credit():
  code = get_reward("code")
  check = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"
  assert code("", "```python\ndef sq(x):\n    return x * x\n```", tests=check, entry_point="sq") == 1.0
  assert code("", "```python\ndef sq(x):\n    return x + x\n```", tests=check, entry_point="sq") == 0.0
  assert code("", "```python\nx = 1\n```") == 1.0
  assert code("", "```python\nx = (\n```") == pytest.approx(0.2)
  assert code("", "x = 1") == pytest.approx(0.8)
  assert code("", "x = (") == 0.0 and code("", "   ") == 0.0


def test_split_tests_bad_source_names_the_field():
  with pytest.raises(ValueError, match="tests"):
    split_tests("assert (", None)
  with pytest.raises(ValueError, match="tests"):
    split_tests(42, None)
