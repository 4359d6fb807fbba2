"""Hostile probes of the sandbox and the code reward (benchmarks/hostile.py, areas "sandbox" and "code"): the
programs of fineflax/testing/sandbox_hostile.py in the mode runs use here, and code-reward answers that
cheat (an always-equal `__eq__`, a nonce hunter that forges result lines)."""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import tempfile
import uuid

from benchmarks._hostile_rows import guarded, row

def _first_words(text: str, n: int = 3) -> list[str]:
  return (text.split() + [""] * n)[:n]


def sandbox_probes() -> list[dict]:
  from fineflax.testing import sandbox_hostile
  from fineflax.rewards import sandbox
  mode = sandbox.resolve_mode()
  area = f"sandbox ({mode})"
  shared = tempfile.mkdtemp(prefix="fineflax_hostile_")
  os.chmod(shared, 0o777)
  tmpdir = os.path.join(shared, "tmp")
  os.mkdir(tmpdir, 0o777)
  outside_file = os.path.join(shared, "public.txt")
  pathlib.Path(outside_file).write_text("HOST FILE")
  token = f"1000.{uuid.uuid4().int % 10 ** 9}"
  abstract = f"fineflax-hostile-{uuid.uuid4().hex}"
  rows = []
  shm = sandbox_hostile.SysvShm()
  tcp, udp = socket.socket(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
  unix_path, unix_abs = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
  old_tempdir = tempfile.tempdir
  try:
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(1)
    udp.bind(("127.0.0.1", 0))
    unix_path.bind(os.path.join(shared, "host.sock"))
    os.chmod(os.path.join(shared, "host.sock"), 0o666)
    unix_abs.bind("\0" + abstract)
    for s in (tcp, unix_path, unix_abs):
      s.listen(4)
    for s in (tcp, udp, unix_path, unix_abs):
      s.settimeout(0.2)
    specs = {**sandbox_hostile.cases(shared, tcp.getsockname()[1], token),
             **sandbox_hostile.isolation_cases(os.path.join(shared, "host.sock"), abstract, shm.key, outside_file),
             "fork_bomb": (sandbox_hostile.FORK_BOMB, {"timeout_s": 2.0, "max_processes": sandbox_hostile.MAX_PROCESSES}),
             "udp": (f"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry:\n"
                     f"  s.sendto(b'hi', ('127.0.0.1', {udp.getsockname()[1]}))\n  print('SENT')\n"
                     "except OSError as e:\n  print('refused', e)\n", {"timeout_s": 5.0})}
    tempfile.tempdir = tmpdir
    try:
      with sandbox_hostile.PeakBytes(tmpdir) as peak:
        res = sandbox_hostile.run_cases(mode, specs)
    finally:
      tempfile.tempdir = old_tempdir
    out = {k: v[1] for k, v in res.items()}

    def accepted(server):
      try:
        server.accept()
        return True
      except OSError:
        return False

    def received(server):
      try:
        server.recv(16)
        return True
      except OSError:
        return False

    escaped = sandbox_hostile.cmdlines_with(token)
    rows += [
      row(area, "bounded fork bomb (40 forks, max_processes=16)", "fork fails (EAGAIN) at <= 16",
          out["bounded_fork"], sandbox_hostile.bounded_contained(out["bounded_fork"])),
      row(area, "true fork bomb, 2 s", "killed at the timeout", f"timed_out={res['fork_bomb'][3]} "
          f"in {res['fork_bomb'][4]:.1f} s", res["fork_bomb"][3] and res["fork_bomb"][4] < 5),
      row(area, "endless loop, timeout 1 s", "killed at ~1 s", f"timed_out={res['infinite_loop'][3]} "
          f"in {res['infinite_loop'][4]:.1f} s", res["infinite_loop"][3] and res["infinite_loop"][4] < 3),
      row(area, "memory bomb, memory_mb=128", "MemoryError at <= 128 MB", out["memory_bomb"],
          _first_words(out["memory_bomb"], 2)[0] == "capped" and int(out["memory_bomb"].split()[1]) <= 128),
      row(area, "setsid + double fork, then return", "no process left", f"left: {escaped or 'none'}",
          not escaped and "parent done" in out["setsid_escape"]),
      row(area, "write a file outside the work dir", "no file on the host",
          (res["write_outside"][2].strip().splitlines() or ["no error"])[-1].replace(shared, "<host dir>"),
          not os.path.exists(os.path.join(shared, "escaped.txt"))),
      row(area, "read /etc/shadow", "denied", out["read_root"], "READ" not in out["read_root"]),
      row(area, "read a world-readable host file", "not visible", out["read_outside"].replace(shared, "<host dir>"),
          "HOST FILE" not in out["read_outside"]),
      row(area, "TCP to a host port on 127.0.0.1", "refused, nothing accepted", out["network"],
          "CONNECTED" not in out["network"] and not accepted(tcp)),
      row(area, "UDP to a host port on 127.0.0.1", "nothing received", out["udp"], not received(udp)),
      row(area, "0666 host Unix socket (path, abstract)", "both refused, nothing accepted",
          out["unix_sockets"].replace(shared, "<host dir>").replace("\\x00" + abstract, "@<abstract>"),
          "CONNECTED" not in out["unix_sockets"] and not accepted(unix_path) and not accepted(unix_abs)),
      row(area, "0666 System V shm segment of the host", "not attached, host bytes unchanged",
          f"{out['sysv_shm']} host bytes {shm.content()!r}",
          "ATTACHED" not in out["sysv_shm"] and shm.content() == b"HOSTDATA"),
      row(area, "write 1 GB in 8 MB files", f"ENOSPC at <= {sandbox.MAX_DISK_MB} MB, host temp dir < 4 MB",
          f"{out['disk_fill'].strip()} (errno); host temp dir peak {peak.value / 2 ** 20:.1f} MB",
          _first_words(out["disk_fill"])[0] == "stopped" and int(out["disk_fill"].split()[1]) <= sandbox.MAX_DISK_MB
          and peak.value < 4 << 20),
      row(area, "create 30,000 files", f"ENOSPC at <= {sandbox.MAX_FILES} files",
          f"{out['many_files'].strip()} (errno)", _first_words(out["many_files"])[0] == "stopped"
          and int(out["many_files"].split()[1]) <= sandbox.MAX_FILES),
    ]
  finally:
    for pid in sandbox_hostile.cmdlines_with(token):
      os.kill(pid, signal.SIGKILL)
    for s in (tcp, udp, unix_path, unix_abs):
      s.close()
    shm.close()
    shutil.rmtree(shared, ignore_errors=True)
  return rows


def code_probes() -> list[dict]:
  from fineflax.testing import sandbox_hostile
  from fineflax.rewards import get_reward
  code = get_reward("code")

  def score(solution, tests):
    def probe():
      value = code("", f"```python\n{solution}```", tests=tests)
      return f"score {value}", value == 0.0
    return probe

  return [guarded("code reward", "object whose __eq__ is always True (and an int subclass)", "score 0",
                  score(sandbox_hostile.ALWAYS_EQUAL, ["assert f(1) == 2", "assert f(2) == [1, 2]", "assert g(0) == 3"])),
          guarded("code reward", "hunt the nonce (frames, gc, /proc, files), forge result lines", "score 0",
                  score(sandbox_hostile.FORGER, ["assert f() == 1", "assert f() == 2"]))]
