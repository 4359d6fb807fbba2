"""Run untrusted Python source in a separate, isolated, resource-limited process.

Contract: `run_python(source, timeout_s, memory_mb, mode=None) -> SandboxResult(returncode, stdout, stderr,
timed_out)`. Nothing is exec'd or eval'd in the calling process. The child runs main.py in its work dir
(its cwd, $HOME and $TMPDIR); stdout/stderr go to files outside it (capped by RLIMIT_FSIZE, read back
truncated to `max_output_bytes`).

Mode: the `mode` argument, else the environment variable FINEFLAX_SANDBOX, else "auto". The sandbox never
degrades silently: if the chosen mode cannot start, every run raises `SandboxUnavailableError` saying why
and how to fix it (a `RewardSetupError`, which reward scoring does not turn into a 0 score).
- "auto": "root" when the caller is root, else "userns".
- "root" (caller is root): the child joins a per-run cgroup (`cgroups.py`: pids.max = max_processes + 1,
  memory cap = memory_mb, kill-all; where writable) and enters new mount, network, IPC and PID namespaces,
  then builds its own root file system (a tmpfs; `pivot_root`, the host's tree detached) holding only:
  the base interpreter's installation and the system library folders (/lib*, /usr/lib*, /usr/local/lib,
  /etc/ld.so.cache) read-only and nosuid at their own paths, /dev/{null,zero,full,random,urandom}, a fresh
  /proc, and the work dir: a tmpfs of `max_disk_mb` MB and `max_files` files (writes beyond fail with
  ENOSPC; it vanishes with the run, the host's disk is never written). It then runs the base interpreter
  (the program sees the base installation's packages, not a venv's) as a fresh unused uid/gid with no
  groups: RLIMIT_NPROC binds it (root is exempt). So: no network (a downed loopback only), no host Unix
  socket (no host path; abstract sockets live in the network namespace), no host System V / POSIX IPC,
  no host file beyond those listed.
- "userns" (caller is not root; unprivileged user namespaces allowed): the same namespaces and root file
  system inside a new user namespace (the caller's uid mapped to itself); RLIMIT_NPROC = the caller's
  process count + budget.
- "bwrap": removed (bubblewrap cannot give the work dir a file-count limit); naming it is an error.
- "rlimits" (opt-in by name only: weak): no namespaces. Writes outside the temp dir, reads of the
  caller's files, host Unix sockets and IPC are NOT prevented, and the work dir has no size or file-count
  limit; sockets are blocked by a monkeypatch of `socket` (best effort); as root it requires a writable
  pids cgroup (RLIMIT_NPROC does not bind root); not as root, processes that escape the session (setsid)
  survive.

In every mode: RLIMIT_AS = memory_mb (allocations beyond it raise MemoryError), RLIMIT_NPROC,
RLIMIT_FSIZE = max_file_mb, RLIMIT_CPU = timeout + 1 s, RLIMIT_CORE = 0, a new session, a wall-clock
timeout (`timed_out=True`, returncode -9). On return every process of the run is killed: in the namespace
modes its PID namespace dies with its init (the program, which also dies with its supervisor); then the
process group, the cgroup (root) and the sandbox uid ("root") are swept.
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

from fineflax.rewards import cgroups
from fineflax.rewards.errors import RewardSetupError
from fineflax.rewards.sandbox_rootfs import (AT_FDCWD, LIBC, MS_BIND, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_REC,
                                             SYS_MOUNT_SETATTR, SYS_PIVOT_ROOT, RootFs, build_root, check_errno,
                                             host_view)

MODES = ("auto", "root", "userns", "rlimits")
ENV_VAR = "FINEFLAX_SANDBOX"
MAX_DISK_MB, MAX_FILES = 64, 4096  # the work dir's default size and file-count limits
_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWPID = 0x00020000, 0x10000000, 0x40000000, 0x20000000
_CLONE_NEWIPC = 0x08000000
_PR_SET_PDEATHSIG = 1
_UID_BASE, _UID_SPAN = 1_900_000_000, 1 << 20
_SOCKET_GUARD = (
  "import socket as _s\n"
  "def _deny(*a, **k):\n    raise OSError(101, 'network disabled in sandbox')\n"
  "_s.socket = _deny; _s.create_connection = _deny; _s.socketpair = _deny\n"
  "import runpy; runpy.run_path('main.py', run_name='__main__')\n"
)
_FIX = (f"Fix: run as root where namespaces may be created (Docker: --privileged, or --cap-add SYS_ADMIN "
        f"--security-opt seccomp=unconfined --security-opt apparmor=unconfined), or as a non-root user with "
        f"unprivileged user namespaces enabled (mode 'userns'; sysctl user.max_user_namespaces>0, "
        f"kernel.unprivileged_userns_clone=1, kernel.apparmor_restrict_unprivileged_userns=0); or accept weaker "
        f"isolation (no file-system, network, IPC or disk-quota isolation) by name: {ENV_VAR}=rlimits.")


class SandboxUnavailableError(RewardSetupError):
  """The requested isolation mode cannot run here; the message says why and how to fix it."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  returncode: int
  stdout: str
  stderr: str
  timed_out: bool


_uid_counter = itertools.count((os.getpid() * 7919) % _UID_SPAN)
_probe_lock = threading.Lock()
_probed: dict[str, str | None] = {}  # mode -> None (works) or why not


def _supervise(pid: int, max_fd: int) -> None:
  """The intermediate process (outside the PID namespace): wait for its init, exit with its status."""
  os.closerange(0, max_fd)  # holds no pipe (Popen waits for the exec-error pipe to close)
  while True:
    try:
      _, status = os.waitpid(pid, 0)
      break
    except InterruptedError:
      continue
    except OSError:
      os._exit(255)
  if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(128 + os.WTERMSIG(status))
  os._exit(os.waitstatus_to_exitcode(status))


def _make_preexec(mode: str, fs: RootFs | None, uid: int, limits: dict[int, int], join_fds: list[int]):
  """Returns the child-side setup; every name it touches is bound here (no imports after fork)."""
  libc, byref, sizeof = LIBC, ctypes.byref, ctypes.sizeof
  sigkill = int(signal.SIGKILL)
  caller_uid, caller_gid = os.getuid(), os.getgid()
  max_fd = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
  max_fd = 1 << 20 if max_fd == resource.RLIM_INFINITY or max_fd > 1 << 20 else max_fd

  def mount_tmpfs(target: bytes, options: bytes) -> None:
    check_errno(libc.mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV, options), f"tmpfs {target!r}")

  def bind(src: bytes, target: bytes) -> None:
    check_errno(libc.mount(src, target, None, MS_BIND | MS_REC, None), f"bind {src!r}")

  def setattr_(target: bytes, flags: int, attr, what: str) -> None:
    check_errno(libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, target, flags, byref(attr), sizeof(attr)), what)

  def setup() -> None:
    for fd in join_fds:  # join the run's cgroups (inherited by everything forked below)
      os.write(fd, b"0")
    if fs is not None:
      flags = (_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC
               | (_CLONE_NEWUSER if mode == "userns" else 0))
      check_errno(libc.unshare(flags), "unshare")
      if mode == "userns":
        for name, text in (("setgroups", "deny"), ("uid_map", f"{caller_uid} {caller_uid} 1"),
                           ("gid_map", f"{caller_gid} {caller_gid} 1")):
          fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
          os.write(fd, text.encode())
          os.close(fd)
      pid = libc.fork()  # the child is PID 1 of the new namespace; its exit kills the namespace
      if pid < 0:
        check_errno(-1, "fork")
      if pid > 0:
        _supervise(pid, max_fd)
      check_errno(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
      build_root(fs, mount_tmpfs, bind, setattr_)
    for res, value in limits.items():
      resource.setrlimit(res, (value, value))
    if mode == "root":
      os.setgroups([])
      os.setresgid(uid, uid, uid)
      os.setresuid(uid, uid, uid)
    if fs is not None:  # after the uid change, which clears it
      check_errno(libc.prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0), "parent-death signal")

  def preexec() -> None:
    try:
      setup()
    except BaseException as e:
      os.write(2, f"sandbox setup failed ({mode}): {e}\n".encode())
      raise

  return preexec


def _interpreter() -> tuple[str, str]:
  """(real base installation prefix, interpreter path relative to it): what the namespace modes show
  (at its own path) and run."""
  prefix = os.path.realpath(sys.base_prefix)
  for candidate in (sys.executable, getattr(sys, "_base_executable", "")):
    exe = os.path.realpath(candidate) if candidate else ""
    if exe and os.path.commonpath([prefix, exe]) == prefix:
      return prefix, os.path.relpath(exe, prefix)
  for rel in (f"bin/python{sys.version_info[0]}.{sys.version_info[1]}", "bin/python3"):
    if os.access(os.path.join(prefix, rel), os.X_OK):
      return prefix, rel
  raise SandboxUnavailableError(f"sandbox: no interpreter of this Python found under its base "
                                f"prefix {prefix} (sys.executable={sys.executable})")


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


def _children(pid: int) -> list[int]:
  try:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
      return [int(c) for c in f.read().split()]
  except OSError:
    return []


def _kill_all(proc: subprocess.Popen, mode: str, uid: int, cg: cgroups.RunCgroup | None) -> None:
  if mode != "rlimits" and proc.poll() is None:  # kill the namespace's init first (the kernel then kills
    for pid in _children(proc.pid):              # the rest) so the supervisor reaps it: no orphan zombie
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    try:
      proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
      pass
  try:
    os.killpg(proc.pid, signal.SIGKILL)  # the supervisor (PDEATHSIG then kills the init) or the program
  except OSError:
    pass
  if cg is not None:
    cg.kill_and_remove()
  if mode == "root":
    cgroups.kill_until_empty(lambda: _uids_processes(uid), timeout_s=2.0)


def _read_capped(path: str, limit: int) -> str:
  with open(path, "rb") as f:
    return f.read(limit).decode("utf-8", errors="replace")


def _run(source: str, timeout_s: float, memory_mb: int, mode: str, stdin: str, max_processes: int,
         max_file_mb: int, max_output_bytes: int, files: dict[str, str] | None, max_disk_mb: int = MAX_DISK_MB,
         max_files: int = MAX_FILES) -> SandboxResult:
  root_dir = tempfile.mkdtemp(prefix="fineflax_sandbox_")
  cg, join_fds = None, []
  try:
    os.chmod(root_dir, 0o755)
    workdir = os.path.join(root_dir, "work")  # the cwd Popen enters before the setup; in the namespace
    os.mkdir(workdir, 0o700)                    # modes a tmpfs at the same path in the new root hides it
    contents = {**(files or {}), "main.py": source}
    for name in contents:
      if not name or os.path.basename(name) != name or name.startswith("."):
        raise ValueError(f"run_python: file name {name!r} must be a plain name (no folder, not hidden)")
    uid = _UID_BASE + next(_uid_counter) % _UID_SPAN
    python, fs, nproc = sys.executable, None, max_processes
    if mode == "rlimits":
      for name, text in contents.items():
        with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
          f.write(text)
    else:
      prefix, rel = _interpreter()
      python = os.path.join(prefix, rel)
      mount_point = os.path.join(root_dir, "root")
      os.mkdir(mount_point, 0o755)
      owner = f",uid={uid},gid={uid}" if mode == "root" else ""
      binds = [(kind, src.encode(), dst.encode()) for kind, src, dst in host_view(prefix)]
      fs = RootFs(mount_point.encode(), binds, workdir.encode(),
                   f"size={int(max_disk_mb)}m,nr_inodes={int(max_files) + 1},mode=0700{owner}".encode(),
                   [(n.encode(), t.encode("utf-8")) for n, t in contents.items()], uid if mode == "root" else -1)
    if os.geteuid() != 0:
      supervisors = 1 if mode == "userns" else 0  # processes of ours next to the program
      nproc = sum(1 for _ in _uids_processes(os.getuid())) + max_processes + supervisors
    if os.geteuid() == 0:
      cg = cgroups.create(max_processes + (mode != "rlimits"), int(memory_mb) << 20)
      if mode == "rlimits" and not (cg and cg.pids_limited):
        raise SandboxUnavailableError("sandbox mode 'rlimits' as root: no writable pids cgroup, and "
                                      "RLIMIT_NPROC does not bind root (a fork bomb would flood the host). "
                                      "Use mode 'root' (the default for root). " + _FIX)
      join_fds = cgroups.open_join_fds(cg)
    limits = {resource.RLIMIT_AS: int(memory_mb) << 20, resource.RLIMIT_NPROC: nproc,
              resource.RLIMIT_FSIZE: int(max_file_mb) << 20, resource.RLIMIT_CORE: 0,
              resource.RLIMIT_CPU: int(math.ceil(timeout_s)) + 1}
    argv = ([python, "-I", "-c", _SOCKET_GUARD] if mode == "rlimits" else
            [python, "-I", "-X", "frozen_modules=off", "main.py"])
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    out_path, err_path = os.path.join(root_dir, "stdout"), os.path.join(root_dir, "stderr")
    preexec = _make_preexec(mode, fs, uid, limits, join_fds)
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
      proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                              preexec_fn=preexec, start_new_session=True, close_fds=True)
      timed_out = False
      try:
        proc.communicate(stdin.encode(), timeout=timeout_s)
      except subprocess.TimeoutExpired:
        timed_out = True
      finally:
        _kill_all(proc, mode, uid, cg)
        proc.wait()
    return SandboxResult(returncode=-9 if timed_out else proc.returncode,
                         stdout=_read_capped(out_path, max_output_bytes),
                         stderr=_read_capped(err_path, max_output_bytes), timed_out=timed_out)
  except subprocess.SubprocessError as e:  # the child's setup failed before exec
    detail = _read_capped(os.path.join(root_dir, "stderr"), 2000).strip()
    raise SandboxUnavailableError(f"sandbox mode {mode!r} cannot start: {e} {detail}. {_FIX}") from None
  finally:
    for fd in join_fds:
      os.close(fd)
    if cg is not None:
      cg.kill_and_remove()
    shutil.rmtree(root_dir, ignore_errors=True)


def resolve_mode(mode: str | None = None) -> str:
  """The mode to use (argument, else $FINEFLAX_SANDBOX, else 'auto'); raises SandboxUnavailableError if it
  cannot run here (probed once per process with a trivial program)."""
  name = mode or os.environ.get(ENV_VAR) or "auto"
  if name == "bwrap":
    raise SandboxUnavailableError(f"sandbox mode 'bwrap' (argument or ${ENV_VAR}) was removed: bubblewrap "
                                  f"cannot limit the work dir's file count; use 'userns' (or 'auto'), the same "
                                  f"namespaces built by fineflax itself.")
  if name not in MODES:
    raise ValueError(f"sandbox mode {name!r} (argument or ${ENV_VAR}): expected one of {MODES}")
  candidates = [name] if name != "auto" else ["root"] if os.geteuid() == 0 else ["userns"]
  with _probe_lock:
    for c in candidates:
      if c not in _probed:
        _probed[c] = _probe(c)
      if _probed[c] is None:
        return c
  raise SandboxUnavailableError(" / ".join(_probed[c] for c in candidates))


def _probe(mode: str) -> str | None:
  """None if `mode` runs print('ok') here, else a message saying why not and how to fix it."""
  if mode == "root" and os.geteuid() != 0:
    return f"sandbox mode 'root' needs root (euid is {os.geteuid()}); use 'userns' or 'auto'."
  if mode == "userns" and os.geteuid() == 0:
    return (f"sandbox mode {mode!r} as root: RLIMIT_NPROC does not bind root, so a fork bomb would flood the "
            "host; use 'root' (or 'auto').")
  if mode != "rlimits" and SYS_PIVOT_ROOT is None:
    return f"sandbox mode {mode!r}: pivot_root's syscall number on {os.uname().machine} is not known here."
  try:
    result = _run("print('ok')", 20.0, 512, mode, "", 16, 1, 1 << 12, None)
  except SandboxUnavailableError as e:
    return str(e)
  except OSError as e:
    return f"sandbox mode {mode!r} cannot start: {e}. {_FIX}"
  if result.returncode != 0 or result.stdout.strip() != "ok":
    return (f"sandbox mode {mode!r} cannot start: a trivial program exited with {result.returncode}, "
            f"stderr: {result.stderr.strip()[-800:]!r}. {_FIX}")
  return None


def isolation_mode() -> str:
  """The mode runs use here (see `resolve_mode`)."""
  return resolve_mode()


def run_python(source: str, timeout_s: float = 5.0, memory_mb: int = 512, *, stdin: str = "",
               max_processes: int = 16, max_file_mb: int = 16, max_output_bytes: int = 1 << 20,
               files: dict[str, str] | None = None, mode: str | None = None, max_disk_mb: int = MAX_DISK_MB,
               max_files: int = MAX_FILES) -> SandboxResult:
  """Runs `source` as main.py in a sandboxed child (see module docstring); never raises for program errors.

  `files` are extra text files written next to main.py; `stdin` is fed to the child. The work dir holds
  at most `max_disk_mb` MB in at most `max_files` files and folders (namespace modes). Raises
  SandboxUnavailableError if the isolation mode cannot run here.
  """
  if timeout_s <= 0 or memory_mb <= 0 or max_disk_mb <= 0 or max_files <= len(files or {}):
    raise ValueError(f"run_python: timeout_s={timeout_s}, memory_mb={memory_mb}, max_disk_mb={max_disk_mb} "
                     f"must be > 0 and max_files={max_files} > the {len(files or {})} files given")
  return _run(source, float(timeout_s), int(memory_mb), resolve_mode(mode), stdin, max_processes,
              max_file_mb, max_output_bytes, files, max_disk_mb, max_files)
