"""Code sandbox cost and containment, per isolation mode available to the current user.

  python -m benchmarks.sandbox [--runs 20] [--no-write]

Per mode: wall time of one `run_python("pass")` and of one `code` reward with 3 unit tests (p50 / p90 over
--runs), and a true fork bomb (max_processes=16, timeout 2 s): the host's peak process count over the
baseline (sampled from /proc every 5 ms), the 1-minute load average before/after, and live processes left
by the run's uid (root mode) after it returns. Run as root to measure the 'root' and 'rlimits' modes.
"""
from __future__ import annotations

import argparse
import os
import platform
import threading
import time

import numpy as np


from benchmarks._results import markdown_table, write_section
from fineflax.rewards import get_reward, sandbox

FORK_BOMB = "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n"
COMPLETION = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add(-1, 1) == 0"]


def _procs() -> int:
  return sum(1 for p in os.listdir("/proc") if p.isdigit())


def _load() -> float:
  with open("/proc/loadavg") as f:
    return float(f.read().split()[0])


def fork_bomb(mode: str) -> dict:
  baseline, peak, stop = _procs(), [0], threading.Event()

  def sample():
    while not stop.is_set():
      peak[0] = max(peak[0], _procs())
      time.sleep(0.005)

  load_before = _load()
  thread = threading.Thread(target=sample, daemon=True)
  thread.start()
  start = time.monotonic()
  r = sandbox.run_python(FORK_BOMB, timeout_s=2.0, max_processes=16, mode=mode)
  seconds = time.monotonic() - start
  stop.set()
  thread.join()
  time.sleep(0.05)
  left = "n/a"
  if mode == "root":
    uids = {}
    for p in os.listdir("/proc"):
      try:
        uids[p] = os.stat(f"/proc/{p}").st_uid if p.isdigit() else -1
      except OSError:
        pass
    left = sum(len(sandbox._uids_processes(u)) for u in set(uids.values()) if u >= sandbox._UID_BASE)
  return {"timed_out": r.timed_out, "seconds": seconds, "baseline": baseline, "peak_over": peak[0] - baseline,
          "load_before": load_before, "load_after": _load(), "left": left}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--runs", type=int, default=20)
  ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
  args = ap.parse_args()
  code = get_reward("code")
  rows, bombs = [], []
  modes = ["root", "rlimits"] if os.geteuid() == 0 else ["userns", "rlimits"]
  for mode in modes:
    try:
      sandbox.resolve_mode(mode)
    except sandbox.SandboxUnavailableError as e:
      print(f"{mode}: unavailable: {e}")
      continue
    os.environ[sandbox.ENV_VAR] = mode
    plain, reward = [], []
    for _ in range(args.runs):
      t = time.perf_counter()
      sandbox.run_python("pass", mode=mode)
      plain.append(time.perf_counter() - t)
      t = time.perf_counter()
      assert abs(code("", COMPLETION, tests=TESTS) - 2 / 3) < 1e-9
      reward.append(time.perf_counter() - t)
    ms = lambda xs, q: float(np.percentile(xs, q) * 1e3)
    rows.append([mode, ms(plain, 50), ms(plain, 90), ms(reward, 50), ms(reward, 90)])
    b = fork_bomb(mode)
    bombs.append([mode, b["timed_out"], b["seconds"], b["baseline"], b["peak_over"], b["load_before"],
                  b["load_after"], b["left"]])
    print(rows[-1], bombs[-1], flush=True)
  os.environ.pop(sandbox.ENV_VAR, None)
  user = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
  md = (f"## Code sandbox\n\nDevice: CPU, {os.cpu_count()} cores ({platform.machine()}), shared with other jobs; "
        f"python {platform.python_version()}, kernel {platform.release()}, as {user}. "
        f"Command: `python -m benchmarks.sandbox --runs {args.runs}`.\n\n"
        "Wall time per run (ms): `run_python(\"pass\")` and one `code` reward with 3 unit tests.\n\n"
        + markdown_table(["mode", "run p50", "run p90", "code reward p50", "code reward p90"], rows)
        + "\n\nTrue fork bomb (`max_processes=16`, timeout 2 s): host processes sampled from /proc every 5 ms; "
        "`left` = live processes of any sandbox uid 50 ms after it returned (root mode).\n\n"
        + markdown_table(["mode", "timed out", "seconds", "host processes before", "peak increase",
                          "load 1m before", "load 1m after", "left"], bombs))
  print(md)
  if not args.no_write:
    write_section("sandbox", md)


if __name__ == "__main__":
  main()
