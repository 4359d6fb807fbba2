"""Run untrusted Python source in a separate, resource-limited process.

Contract: `run_python(source, timeout_s, memory_mb) -> SandboxResult(returncode, stdout, stderr, timed_out)`.
Nothing is exec'd or eval'd in the calling process. The child is `python -I main.py` in a fresh temp dir
(its cwd); stdout/stderr go to files (capped by RLIMIT_FSIZE, read back truncated to `max_output_bytes`).

Isolation, strongest mode that works here (probed once, see `isolation_mode()`):

- "root" (caller is root): in `preexec_fn` the child enters new mount + network namespaces
  (`unshare(CLONE_NEWNS | CLONE_NEWNET)`: no interface but a downed loopback, so every connection fails),
  remounts the whole tree read-only (`mount_setattr(AT_RECURSIVE, MOUNT_ATTR_RDONLY)`) except its temp dir,
  bind-mounts the interpreter prefix at a world-readable path (so it works from a 0700 /root), then drops to
  a per-run unused uid/gid (no supplementary groups), so RLIMIT_NPROC applies (root is exempt from it) and
  root-only files stay unreadable. After the run every process of that uid is SIGKILLed (found in /proc).
- "userns" (not root, unprivileged user namespaces allowed): same, with `CLONE_NEWUSER` instead of the uid
  switch; RLIMIT_NPROC counts all the caller's processes, so it is set to their current count + the budget.
- "rlimits" (neither works): rlimits only; sockets are blocked by a monkeypatch of `socket.socket` and
  `socket.create_connection` applied before the program runs (best effort: `_socket` stays reachable); writes
  outside the temp dir are NOT prevented; escaped processes (setsid) may survive the process-group kill.

In every mode: RLIMIT_AS = memory_mb (allocations beyond it raise MemoryError), RLIMIT_NPROC = max_processes
(fork bombs get EAGAIN), RLIMIT_FSIZE = max_file_mb, RLIMIT_CPU = timeout + 1 s, RLIMIT_CORE = 0, a new
session (process group) killed on return, a wall-clock timeout (`timed_out=True`, returncode -9).
"""
from __future__ import annotations

import ctypes
import dataclasses
import itertools
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = -100, 0x8000, 1
_SYS_MOUNT_SETATTR = 442  # same number on x86_64 and aarch64 (new syscall table)
_UID_BASE, _UID_SPAN = 1_900_000_000, 1 << 20
_SOCKET_GUARD = (
    "import socket as _s\n"
    "def _deny(*a, **k):\n    raise OSError(101, 'network disabled in sandbox')\n"
    "_s.socket = _deny; _s.create_connection = _deny; _s.socketpair = _deny\n"
    "import runpy; runpy.run_path('main.py', run_name='__main__')\n"
)


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  returncode: int
  stdout: str
  stderr: str
  timed_out: bool


class _MountAttr(ctypes.Structure):
  _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
              ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


_LIBC = ctypes.CDLL(None, use_errno=True)
_RO, _RW = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0), _MountAttr(0, _MOUNT_ATTR_RDONLY, 0, 0)
_uid_counter = itertools.count((os.getpid() * 7919) % _UID_SPAN)
_mode_lock = threading.Lock()
_mode: str | None = None


def _check(rc: int, what: str) -> None:
  if rc != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"sandbox {what}: {os.strerror(err)}")


def _make_preexec(mode: str, workdir: bytes, py_src: bytes, py_dst: bytes, uid: int,
                  limits: dict[int, int]):
  """Returns the child-side setup; every name it touches is bound here (no imports after fork)."""
  libc, ro, rw, byref, sizeof = _LIBC, _RO, _RW, ctypes.byref, ctypes.sizeof

  def preexec() -> None:
    if mode in ("root", "userns"):
      flags = _CLONE_NEWNS | _CLONE_NEWNET | (_CLONE_NEWUSER if mode == "userns" else 0)
      _check(libc.unshare(flags), "unshare")
      _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
      _check(libc.mount(workdir, workdir, None, _MS_BIND | _MS_REC, None), "bind workdir")
      if py_dst:
        _check(libc.mount(py_src, py_dst, None, _MS_BIND | _MS_REC, None), "bind python")
      _check(libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, b"/", _AT_RECURSIVE, byref(ro), sizeof(ro)),
             "read-only /")
      _check(libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, workdir, _AT_RECURSIVE, byref(rw), sizeof(rw)),
             "writable workdir")
      os.chdir(workdir)  # the cwd set by Popen points below the bind mount
    for res, value in limits.items():
      resource.setrlimit(res, (value, value))
    if mode == "root":
      os.setgroups([])
      os.setresgid(uid, uid, uid)
      os.setresuid(uid, uid, uid)

  return preexec


def _python_bind(root_dir: str) -> tuple[str, str, str]:
  """(source prefix, mount point, interpreter path under the mount point) for the 'root' mode."""
  prefix = os.path.realpath(sys.base_prefix)
  exe = os.path.realpath(sys.executable)
  if os.path.commonpath([prefix, exe]) != prefix or sys.prefix != sys.base_prefix:
    return "", "", sys.executable  # venvs or odd layouts: run the interpreter where it is
  dst = os.path.join(root_dir, "py")
  os.mkdir(dst, 0o755)
  return prefix, dst, os.path.join(dst, os.path.relpath(exe, prefix))


def _uids_processes(uid: int) -> list[int]:
  """Live (non-zombie) processes owned by `uid`, from /proc."""
  pids = []
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        if os.stat(f"/proc/{name}").st_uid != uid:
          continue
        with open(f"/proc/{name}/stat", "rb") as f:
          state = f.read().rsplit(b")", 1)[1].split()[0]
      except (OSError, IndexError):
        continue
      if state not in (b"Z", b"X"):
        pids.append(int(name))
  return pids


def _kill_all(proc: subprocess.Popen, mode: str, uid: int) -> None:
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except OSError:
    pass
  if mode == "root":
    for _ in range(100):  # a fork bomb may refill between scans; RLIMIT_NPROC bounds each round
      pids = _uids_processes(uid)
      if not pids:
        break
      for pid in pids:
        try:
          os.kill(pid, signal.SIGKILL)
        except OSError:
          pass
      time.sleep(0.005)


def _read_capped(path: str, limit: int) -> str:
  with open(path, "rb") as f:
    return f.read(limit).decode("utf-8", errors="replace")


def _own_process_count() -> int:
  return sum(1 for _ in _uids_processes(os.getuid()))


def _run(source: str, timeout_s: float, memory_mb: int, mode: str, stdin: str, max_processes: int,
         max_file_mb: int, max_output_bytes: int, files: dict[str, str] | None) -> SandboxResult:
  root_dir = tempfile.mkdtemp(prefix="fineflax_sandbox_")
  try:
    os.chmod(root_dir, 0o755)
    workdir = os.path.join(root_dir, "work")
    os.mkdir(workdir, 0o700)
    for name, text in {**(files or {}), "main.py": source}.items():
      with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
        f.write(text)
    uid = _UID_BASE + next(_uid_counter) % _UID_SPAN
    py_src, py_dst, python = "", "", sys.executable
    nproc = max_processes
    if mode == "root":
      py_src, py_dst, python = _python_bind(root_dir)
      os.chown(workdir, uid, uid)
      for name in os.listdir(workdir):
        os.chown(os.path.join(workdir, name), uid, uid)
    elif mode == "userns":
      nproc = _own_process_count() + max_processes
    limits = {resource.RLIMIT_AS: int(memory_mb) << 20, resource.RLIMIT_NPROC: nproc,
              resource.RLIMIT_FSIZE: int(max_file_mb) << 20, resource.RLIMIT_CORE: 0,
              resource.RLIMIT_CPU: int(math.ceil(timeout_s)) + 1}
    argv = [python, "-I", "-c", _SOCKET_GUARD] if mode == "rlimits" else [python, "-I", "-X", "frozen_modules=off", "main.py"]
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out_path, err_path = os.path.join(root_dir, "stdout"), os.path.join(root_dir, "stderr")
    preexec = _make_preexec(mode, workdir.encode(), py_src.encode(), py_dst.encode(), uid, limits)
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
      proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                              preexec_fn=preexec, start_new_session=True, close_fds=True)
      timed_out = False
      try:
        proc.communicate(stdin.encode(), timeout=timeout_s)
      except subprocess.TimeoutExpired:
        timed_out = True
      finally:
        _kill_all(proc, mode, uid)
        proc.wait()
    return SandboxResult(returncode=-9 if timed_out else proc.returncode,
                         stdout=_read_capped(out_path, max_output_bytes),
                         stderr=_read_capped(err_path, max_output_bytes), timed_out=timed_out)
  finally:
    shutil.rmtree(root_dir, ignore_errors=True)


def isolation_mode() -> str:
  """The strongest mode ('root' > 'userns' > 'rlimits') that runs a trivial program here; cached."""
  global _mode
  with _mode_lock:
    if _mode is None:
      candidates = (["root"] if os.geteuid() == 0 else []) + ["userns"]
      _mode = "rlimits"
      for mode in candidates:
        try:
          result = _run("print('ok')", 10.0, 512, mode, "", 16, 1, 1 << 10, None)
        except (OSError, subprocess.SubprocessError):
          continue
        if result.returncode == 0 and result.stdout.strip() == "ok":
          _mode = mode
          break
    return _mode


def run_python(source: str, timeout_s: float = 5.0, memory_mb: int = 512, *, stdin: str = "",
               max_processes: int = 16, max_file_mb: int = 16, max_output_bytes: int = 1 << 20,
               files: dict[str, str] | None = None) -> SandboxResult:
  """Runs `source` as main.py in a sandboxed child (see module docstring); never raises for program errors.

  `files` are extra text files written next to main.py; `stdin` is fed to the child.
  """
  if timeout_s <= 0 or memory_mb <= 0:
    raise ValueError(f"run_python: timeout_s={timeout_s} and memory_mb={memory_mb} must be > 0")
  return _run(source, float(timeout_s), int(memory_mb), isolation_mode(), stdin, max_processes,
              max_file_mb, max_output_bytes, files)
