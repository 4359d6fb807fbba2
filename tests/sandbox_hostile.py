"""Hostile programs for the sandbox tests, and a driver that runs them in one mode and prints JSON.

Usable in-process (`run_cases`) or as a script run as another user (`python sandbox_hostile.py`, spec JSON on
stdin: {"mode": ..., "cases": {name: [source, kwargs]}}; it needs only fineflax.rewards.sandbox).
A true fork bomb ("fork_bomb") is run only after the bounded one ("bounded_fork") was contained.
"""
import json
import sys
import time

MAX_PROCESSES = 16
BOUNDED_FORK = (
  "import os, time\nn = 0\nfor i in range(40):\n  try:\n    pid = os.fork()\n  except OSError as e:\n"
  "    print('EAGAIN after', n, flush=True)\n    break\n  if pid == 0:\n    time.sleep(30)\n    os._exit(0)\n"
  "  n += 1\nprint('forked', n, flush=True)\n")
FORK_BOMB = "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n"


def cases(outside_dir: str, port: int, token: str) -> dict:
  """name -> (source, run_python kwargs). `token` marks the setsid escapee's command line."""
  return {
    "bounded_fork": (BOUNDED_FORK, {"timeout_s": 5.0, "max_processes": MAX_PROCESSES}),
    "infinite_loop": ("while True: pass\n", {"timeout_s": 1.0}),
    "memory_bomb": ("chunks = []\ntry:\n  while True:\n    chunks.append(bytearray(16 << 20))\n"
                    "except MemoryError:\n  print('capped', len(chunks) * 16, flush=True)\n",
                    {"timeout_s": 5.0, "memory_mb": 128}),
    "memory_bomb_forked": ("import os\nfor i in range(4):\n  if os.fork() == 0:\n    try:\n"
                           "      b = bytearray(90 << 20)\n      for j in range(0, len(b), 4096):\n        b[j] = 1\n"
                           "      print('allocated', i, flush=True)\n      __import__('time').sleep(1)\n"
                           "    except MemoryError:\n      pass\n    os._exit(0)\n"
                           "while True:\n  try:\n    os.wait()\n  except ChildProcessError:\n    break\n",
                           {"timeout_s": 5.0, "memory_mb": 128}),
    "write_outside": (f"open('inside.txt', 'w').write('ok')\nopen({outside_dir + '/escaped.txt'!r}, 'w').write('x')\n",
                      {"timeout_s": 5.0}),
    "network": (f"import socket\ntry:\n  socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "  print('CONNECTED')\nexcept OSError as e:\n  print('refused', e)\n", {"timeout_s": 5.0}),
    "setsid_escape": ("import os, time\nif os.fork() == 0:\n  os.setsid()\n  if os.fork() == 0:\n"
                      f"    os.execv('/bin/sleep', ['sleep', {token!r}])\n  os._exit(0)\n"
                      "time.sleep(0.3)\nprint('parent done', flush=True)\n", {"timeout_s": 5.0}),
    "read_root": ("import os\ntry:\n  print('LISTED', os.listdir('/root'))\nexcept OSError as e:\n"
                  "  print('denied', e)\n", {"timeout_s": 5.0}),
  }


def bounded_contained(stdout: str) -> bool:
  """The bounded fork bomb's fork failed (EAGAIN) after at most MAX_PROCESSES forks."""
  words = stdout.split()
  return "EAGAIN" in words and int(words[words.index("EAGAIN") + 2]) <= MAX_PROCESSES


def run_cases(mode: str, specs: dict) -> dict:
  """{name: [returncode, stdout, stderr, timed_out, seconds]}; stops before a fork bomb if needed."""
  from fineflax.rewards.sandbox import run_python
  out = {}
  for name, (source, kwargs) in specs.items():
    if name == "fork_bomb":
      bounded = out.get("bounded_fork")
      if bounded is None or not bounded_contained(bounded[1]):
        out[name] = [None, "not run: the bounded fork bomb was not contained", "", False, 0.0]
        continue
    start = time.monotonic()
    r = run_python(source, mode=mode, **kwargs)
    out[name] = [r.returncode, r.stdout, r.stderr, r.timed_out, time.monotonic() - start]
  return out


if __name__ == "__main__":
  spec = json.load(sys.stdin)
  try:
    result = {"results": run_cases(spec["mode"], spec["cases"])}
  except Exception as e:  # noqa: BLE001 - reported to the test
    result = {"error": f"{type(e).__name__}: {e}"}
  print(json.dumps(result), flush=True)
