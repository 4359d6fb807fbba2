"""Per-run cgroups for the code sandbox: a process cap, a memory cap and kill-everything, where writable.

Contract: `create(max_pids, memory_bytes) -> RunCgroup | None` makes one fresh child cgroup per usable
hierarchy, below this process's own cgroup (so limits set above still apply):
- cgroup v2 (fstype cgroup2): always gives membership and `cgroup.kill` (kernel >= 5.14); `pids.max` and
  `memory.max` (+ `memory.swap.max = 0`) when those controllers are enabled for our children;
- cgroup v1 `pids` hierarchy: `pids.max`; v1 `memory` hierarchy: `memory.limit_in_bytes`.
`RunCgroup.procs` are the `cgroup.procs` files a child writes "0" to (joins itself; see `open_join_fds`);
`kill_and_remove()` SIGKILLs every member until none is left and removes the directories. Without root
(or with /sys/fs/cgroup read-only) nothing is writable and `create` returns None.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import re
import signal
import time

PREFIX = "fineflax_sandbox_"
_counter = itertools.count()


@dataclasses.dataclass
class RunCgroup:
  dirs: list[str]
  procs: list[str]
  kill_files: list[str]
  pids_limited: bool
  memory_limited: bool

  def members(self) -> set[int]:
    pids = set()
    for path in self.procs:
      try:
        with open(path) as f:
          pids.update(int(line) for line in f if line.strip())
      except OSError:
        pass
    return pids

  def kill_and_remove(self, timeout_s: float = 5.0) -> bool:
    """SIGKILL every member (repeatedly: the pid cap bounds each refill) and rmdir; True if all removed."""
    for path in self.kill_files:
      _write(path, "1")
    kill_until_empty(self.members, timeout_s)
    removed = True
    for path in reversed(self.dirs):
      for _ in range(200):  # exiting tasks leave the cgroup a moment after SIGKILL
        try:
          os.rmdir(path)
          break
        except FileNotFoundError:
          break
        except OSError:
          time.sleep(0.005)
      else:
        removed = False
    return removed


def _write(path: str, text: str) -> bool:
  try:
    with open(path, "w") as f:
      f.write(text)
    return True
  except OSError:
    return False


def _own_paths() -> dict[str, str]:
  """{"": v2 path} and {v1 controller: path} from /proc/self/cgroup."""
  paths = {}
  with open("/proc/self/cgroup") as f:
    for line in f:
      _, controllers, path = line.rstrip("\n").split(":", 2)
      for c in controllers.split(",") if controllers else [""]:
        paths[c] = path
  return paths


def _mounts() -> list[tuple[str, str, set[str]]]:
  """(mount point, fstype, super options) of cgroup file systems, from /proc/self/mountinfo."""
  out = []
  with open("/proc/self/mountinfo") as f:
    for line in f:
      left, right = line.split(" - ", 1)
      fstype, _, sopts = right.split()[:3]
      if fstype in ("cgroup", "cgroup2"):
        out.append((left.split()[4].replace("\\040", " "), fstype, set(sopts.split(","))))
  return out


def _remove_stale(parent: str) -> None:
  """rmdir empty run cgroups left by dead processes (named PREFIX<pid>_<n>)."""
  try:
    names = os.listdir(parent)
  except OSError:
    return
  for name in names:
    m = re.fullmatch(re.escape(PREFIX) + r"(\d+)_\d+", name)
    if m and not os.path.exists(f"/proc/{m.group(1)}"):
      try:
        os.rmdir(os.path.join(parent, name))
      except OSError:
        pass


def _make_child(parent: str) -> str | None:
  if not os.access(parent, os.W_OK):
    return None
  _remove_stale(parent)
  path = os.path.join(parent, f"{PREFIX}{os.getpid()}_{next(_counter)}")
  try:
    os.mkdir(path)
  except OSError:
    return None
  return path


def create(max_pids: int, memory_bytes: int) -> RunCgroup | None:
  """A fresh per-run cgroup in every writable hierarchy (see module docstring), or None."""
  if os.geteuid() != 0:
    return None
  try:
    own, mounts = _own_paths(), _mounts()
  except (OSError, ValueError):
    return None
  cg = RunCgroup([], [], [], False, False)
  seen_v2 = False
  for mnt, fstype, sopts in mounts:
    limits = [(c, f, v) for c, f, v in (("pids", "pids.max", max_pids),
                                           ("memory", "memory.limit_in_bytes", memory_bytes))
                 if fstype == "cgroup" and c in sopts and c in own]
    if fstype == "cgroup2" and ("" not in own or seen_v2) or fstype == "cgroup" and not limits:
      continue  # one child per hierarchy (a process is in exactly one cgroup of each)
    seen_v2 |= fstype == "cgroup2"
    path = _make_child(os.path.join(mnt, own["" if fstype == "cgroup2" else limits[0][0]].lstrip("/")))
    if path is None:
      continue
    cg.dirs.append(path)
    cg.procs.append(os.path.join(path, "cgroup.procs"))
    if fstype == "cgroup2":
      if os.path.exists(os.path.join(path, "cgroup.kill")):
        cg.kill_files.append(os.path.join(path, "cgroup.kill"))
      limits = [("pids", "pids.max", max_pids), ("memory", "memory.max", memory_bytes)]
    for controller, limit_file, value in limits:
      if not os.path.exists(os.path.join(path, limit_file)):
        continue
      ok = _write(os.path.join(path, limit_file), str(value))
      if controller == "pids":
        cg.pids_limited |= ok
      else:
        cg.memory_limited |= ok
        if fstype == "cgroup2":
          _write(os.path.join(path, "memory.swap.max"), "0")
  if not cg.dirs:
    return None
  return cg


def open_join_fds(cg: RunCgroup | None) -> list[int]:
  """Write-only fds of `cg.procs`, opened in the parent; the child joins with os.write(fd, b"0")."""
  return [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in cg.procs] if cg else []


def kill_until_empty(list_pids, timeout_s: float) -> None:
  """SIGKILL every pid of `list_pids()` until it returns none or `timeout_s` passes (a fork bomb may
  refill between scans; a process cap bounds each round)."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    pids = list_pids()
    if not pids:
      break
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    time.sleep(0.005)
