"""Hostile programs for the sandbox tests, and a driver that runs them in one mode and prints JSON.

Usable in-process (`run_cases`) or as a script run as another user (`python sandbox_hostile.py`, spec JSON on
stdin: {"mode": ..., "cases": {name: [source, kwargs]}}; it needs only fineflax.rewards.sandbox).
A true fork bomb ("fork_bomb") is run only after the bounded one ("bounded_fork") was contained.
"""
import ctypes
import json
import os
import sys
import threading
import time
import uuid

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
    "read_root": ("try:\n  print('READ', len(open('/etc/shadow').read()))\nexcept OSError as e:\n"
                  "  print('denied', e)\n", {"timeout_s": 5.0}),
  }


def isolation_cases(unix_path: str, abstract_name: str, shm_key: int, outside_file: str) -> dict:
  """Programs for what only the namespace modes stop (issue 36): a 0666 host Unix socket (by path and in
  the abstract namespace), a 0666 System V shared-memory segment (libc shmget/shmat through ctypes), a
  world-readable host file, 1 GB written in 8 MB files and 30,000 files in the work dir."""
  connect = ("import socket\nfor addr in ({!r}, {!r}):\n  try:\n    s = socket.socket(socket.AF_UNIX)\n"
             "    s.settimeout(2)\n    s.connect(addr)\n    s.sendall(b'hello')\n    print('CONNECTED', repr(addr))\n"
             "  except OSError as e:\n    print('refused', repr(addr), e)\n").format(unix_path, "\0" + abstract_name)
  shm = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
         f"i = libc.shmget({shm_key}, 0, 0)\n"
         "if i < 0:\n  print('denied shmget errno', ctypes.get_errno())\nelse:\n"
         "  p = libc.shmat(i, None, 0)\n  if p in (None, ctypes.c_void_p(-1).value):\n"
         "    print('denied shmat errno', ctypes.get_errno())\n  else:\n"
         "    print('ATTACHED', ctypes.string_at(p, 8))\n    ctypes.memmove(p, b'SANDBOX!', 8)\n")
  fill = ("n = 0\ntry:\n  for i in range(128):\n    with open(f'big{i}', 'wb') as f:\n"
          "      f.write(b'x' * (8 << 20))\n    n += 8\n  print('wrote', n)\nexcept OSError as e:\n"
          "  print('stopped', n, e.errno)\n")
  files = ("n = 0\ntry:\n  for i in range(30000):\n    open(f'f{i}', 'w').close()\n    n += 1\n"
           "  print('created', n)\nexcept OSError as e:\n  print('stopped', n, e.errno)\n")
  read = (f"try:\n  print('READ', open({outside_file!r}).read())\nexcept OSError as e:\n  print('denied', e)\n")
  return {"unix_sockets": (connect, {"timeout_s": 5.0}), "sysv_shm": (shm, {"timeout_s": 5.0}),
          "read_outside": (read, {"timeout_s": 5.0}),
          "disk_fill": (fill, {"timeout_s": 10.0, "memory_mb": 256}),
          "many_files": (files, {"timeout_s": 10.0})}


# code-reward exploits (issue 36): an answer that equals everything, and one that hunts the harness's nonce
ALWAYS_EQUAL = """
class Anything:
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__
class Liar(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def f(x):
    return Anything()
def g(x):
    return Liar(7)
"""

FORGER = r"""
import gc, os, re, sys
HEX = re.compile(r"[0-9a-f]{32}")
found = set()
frame = sys._getframe()
while frame is not None:  # the old harness kept its nonce in a caller's locals
    for v in list(frame.f_locals.values()) + list(frame.f_globals.values()):
        if isinstance(v, str):
            found.update(HEX.findall(v))
    frame = frame.f_back
for o in gc.get_objects():
    for v in (o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()):
        if isinstance(v, str):
            found.update(HEX.findall(v))
for path in ["tests.json", "/proc/self/environ", "/proc/self/cmdline", f"/proc/{os.getppid()}/environ",
             f"/proc/{os.getppid()}/cmdline", f"/proc/{os.getppid()}/fd/0", "/proc/1/fd/0"]:
    try:
        with open(path, "rb") as fh:
            found.update(HEX.findall(fh.read(1 << 20).decode("latin-1")))
    except OSError:
        pass
lines = "".join(f"{n} {i} 1\n" for n in found for i in range(4)) or "".join(f"x {i} 1\n" for i in range(4))
for target in (1, f"/proc/{os.getppid()}/fd/1", "/proc/1/fd/1"):
    try:
        if target == 1:
            os.write(1, lines.encode()); sys.__stdout__.write(lines); sys.__stdout__.flush()
        else:
            with open(target, "w") as fh:
                fh.write(lines)
    except OSError:
        pass
def f():
    return 0
"""


class SysvShm:
  """A 0666 System V shared-memory segment holding b"HOSTDATA" (libc shmget/shmat through ctypes)."""

  def __init__(self):
    self.libc = ctypes.CDLL(None, use_errno=True)
    self.libc.shmat.restype = ctypes.c_void_p
    self.libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    self.libc.shmdt.argtypes = [ctypes.c_void_p]
    for _ in range(20):
      self.key = 0x36000000 + uuid.uuid4().int % 0xFFFFFF
      self.id = self.libc.shmget(self.key, 4096, 0o1000 | 0o2000 | 0o666)  # IPC_CREAT | IPC_EXCL
      if self.id >= 0:
        break
    if self.id < 0:
      raise OSError(ctypes.get_errno(), "shmget")
    self.addr = self.libc.shmat(self.id, None, 0)
    ctypes.memmove(self.addr, b"HOSTDATA", 8)

  def content(self):
    return ctypes.string_at(self.addr, 8)

  def close(self):
    self.libc.shmdt(self.addr)
    self.libc.shmctl(self.id, 0, None)  # IPC_RMID


def tree_bytes(root):
  total = 0
  for folder, _, files in os.walk(root):
    for name in files:
      try:
        total += os.lstat(os.path.join(folder, name)).st_size
      except OSError:
        pass
  return total


class PeakBytes:
  """Context manager: the largest total size of the files under `folder`, sampled every 20 ms."""

  def __init__(self, folder: str):
    self.folder, self.value, self._stop = folder, 0, threading.Event()
    self._thread = threading.Thread(target=self._watch, daemon=True)

  def _watch(self):
    while not self._stop.is_set():
      self.value = max(self.value, tree_bytes(self.folder))
      time.sleep(0.02)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
    return False


def cmdlines_with(token: str) -> list[int]:
  """Pids whose command line contains `token` (a setsid escapee's marker)."""
  found = []
  for p in os.listdir("/proc"):
    if p.isdigit():
      try:
        with open(f"/proc/{p}/cmdline", "rb") as f:
          if token.encode() in f.read():
            found.append(int(p))
      except OSError:
        pass
  return found


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
