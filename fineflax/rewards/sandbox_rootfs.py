"""The sandbox's own root file system (`fineflax.rewards.sandbox`, modes "root" and "userns"): what it shows of the
host and how the child builds it.

`host_view(prefix)` lists (kind, source, path inside) of what the new root shows, read-only: the base interpreter's
installation `prefix`, the library folders a dynamically linked interpreter and its extension modules load
(`LIBRARY_DIRS`, a symlinked one as the same symlink) and `HOST_FILES`. `build_root(fs, mount_tmpfs, bind,
setattr_)` runs in the child, in its new mount namespace: a tmpfs root with those binds, a fresh /proc and the
work dir (a tmpfs of the run's size and file-count limits), all read-only and nosuid but the work dir; then
pivot_root into it and detach the host's tree. The mount syscalls' numbers and flags (Linux x86_64 / aarch64)
and `check_errno` (an OSError naming the step and errno) live here too.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os

MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
MNT_DETACH = 2
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = -100, 0x8000, 1, 2
SYS_MOUNT_SETATTR = 442  # same number on x86_64 and aarch64 (new syscall table)
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)
# what the sandbox's own root file system shows of the host (read-only): the base interpreter's
# installation (added per run) and what a dynamically linked interpreter and its extension modules load
LIBRARY_DIRS = ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32",
                 "/usr/local/lib")
HOST_FILES = ("/etc/ld.so.cache", "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


class MountAttr(ctypes.Structure):
  _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
              ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


LIBC = ctypes.CDLL(None, use_errno=True)
RO = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
RW = MountAttr(MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, 0, 0)


def check_errno(rc: int, what: str) -> None:
  if rc != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"sandbox {what}: {os.strerror(err)}")


@dataclasses.dataclass(frozen=True)
class RootFs:
  """The sandbox's own root file system: built at `mount_point` (an empty host dir) in the child."""
  mount_point: bytes
  binds: list            # (kind "dir" | "file" | "link", host path or link target, path inside)
  workdir: bytes         # the work dir's path inside (the same as on the host)
  work_options: bytes    # its tmpfs options: size, nr_inodes, mode, owner
  files: list            # (name, bytes) written into the work dir
  owner: int             # uid/gid of those files (-1: the caller's)


def host_view(prefix: str) -> list[tuple[str, str, str]]:
  """(kind, source, path inside) of what the new root shows of the host: `prefix` (the interpreter's
  installation), the library folders (a symlinked one as the same symlink) and `HOST_FILES`."""
  out, covered = [("dir", prefix, prefix)], [prefix]
  for path in LIBRARY_DIRS:
    if any(path == c or path.startswith(c + "/") for c in covered):
      continue
    if os.path.islink(path):
      out.append(("link", os.readlink(path), path))
    elif os.path.isdir(path):
      out.append(("dir", os.path.realpath(path), path))
      covered.append(path)
  return out + [("file", path, path) for path in HOST_FILES if os.path.exists(path)]


def build_root(fs: RootFs, mount_tmpfs, bind, setattr_) -> None:
  """In the child (new mount namespace): the tmpfs root with `fs.binds`, /proc and the work dir, all
  read-only but the work dir; then pivot_root into it and detach the host's tree."""
  root = fs.mount_point
  mount_tmpfs(root, b"mode=0755,size=4m,nr_inodes=4096")
  for kind, src, dst in fs.binds:
    inside = root + dst
    if kind == "link":
      os.makedirs(os.path.dirname(inside), exist_ok=True)
      os.symlink(src, inside)
      continue
    if kind == "dir":
      os.makedirs(inside, exist_ok=True)
    else:
      os.makedirs(os.path.dirname(inside), exist_ok=True)
      os.close(os.open(inside, os.O_CREAT | os.O_WRONLY, 0o644))
    bind(src, inside)
  os.makedirs(root + b"/proc", exist_ok=True)
  LIBC.mount(b"proc", root + b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)  # best effort
  work = root + fs.workdir
  os.makedirs(work, exist_ok=True)
  mount_tmpfs(work, fs.work_options)
  for name, data in fs.files:
    fd = os.open(work + b"/" + name, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.write(fd, data)
    if fs.owner >= 0:
      os.fchown(fd, fs.owner, fs.owner)
    os.close(fd)
  setattr_(root, AT_RECURSIVE, RO, "read-only root")
  setattr_(work, 0, RW, "writable work dir")
  os.chdir(root)
  check_errno(LIBC.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
  check_errno(LIBC.umount2(b".", MNT_DETACH), "detach the host's root")
  os.chdir(fs.workdir)
