"""Sandbox containment (all child processes; nothing runs in-process; the code reward: test_rewards_code.py).

Hostile programs (fineflax/testing/sandbox_hostile.py) run in every mode this machine supports, as root and as an
unprivileged user (uid 65534 via util-linux unshare + setpriv, with the interpreter bind-mounted so it is
reachable from a 0700 home). Fork bombs: the bounded one first; the true one only once that was contained,
while the host's process count is sampled from /proc.
"""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid

import pytest

from fineflax.rewards import cgroups, sandbox, score_completions
from fineflax.rewards.sandbox import SandboxUnavailableError, run_python
from fineflax.testing import sandbox_hostile


# hostile programs as uid 65534 share that uid's process limit: never run two of them at once (xdist)
pytestmark = pytest.mark.xdist_group("sandbox")

IS_ROOT = os.geteuid() == 0
NOBODY = 65534
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mode_works(mode):
  try:
    return sandbox.resolve_mode(mode) == mode
  except SandboxUnavailableError:
    return False


def _procs():
  return sum(1 for p in os.listdir("/proc") if p.isdigit())


def _uid_pids(predicate):
  """Live (non-zombie: those hold no memory or CPU and init reaps them) processes whose uid matches."""
  out = []
  for p in os.listdir("/proc"):
    if p.isdigit():
      try:
        with open(f"/proc/{p}/stat") as f:
          state = f.read().rsplit(")", 1)[1].split()[0]
        if predicate(os.stat(f"/proc/{p}").st_uid) and state not in ("Z", "X"):
          out.append(int(p))
      except (OSError, IndexError):
        pass
  return out


def _cgroup_memory_writable():
  cg = cgroups.create(16, 1 << 27)
  if cg is None:
    return False
  cg.kill_and_remove()
  return cg.memory_limited


def _standalone_sandbox(root):
  """A copy of fineflax.rewards.sandbox and the modules it imports (stdlib only) under `root`."""
  pkg = os.path.join(root, "fineflax", "rewards")
  os.makedirs(pkg)
  open(os.path.join(root, "fineflax", "__init__.py"), "w").close()
  open(os.path.join(pkg, "__init__.py"), "w").close()
  for name in ("sandbox.py", "sandbox_rootfs.py", "cgroups.py", "errors.py"):
    shutil.copy(os.path.join(REPO, "fineflax", "rewards", name), pkg)


class _NobodyRunner:
  """Runs fineflax/testing/sandbox_hostile.py as uid 65534: a mount namespace binds the interpreter's installation and
  a copy of the sandbox modules at world-readable paths, then setpriv drops to nobody."""

  def __init__(self):
    self.base = tempfile.mkdtemp(prefix="fineflax_nobody_")
    _standalone_sandbox(os.path.join(self.base, "pkg"))
    shutil.copy(os.path.join(REPO, "fineflax", "testing", "sandbox_hostile.py"), self.base)
    for root, dirs, files in os.walk(self.base):
      os.chmod(root, 0o755)
      for f in files:
        os.chmod(os.path.join(root, f), 0o644)
    prefix, rel = sandbox._interpreter()
    self.py_dst = os.path.join(self.base, "py")
    os.mkdir(self.py_dst, 0o755)
    self.cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$0" "$1" && exec setpriv --reuid 65534 --regid 65534 --clear-groups "$2" "$3"',
                prefix, self.py_dst, os.path.join(self.py_dst, rel),
                os.path.join(self.base, "sandbox_hostile.py")]

  def run(self, mode, specs, timeout=120, tmpdir=None):
    r = subprocess.run(self.cmd, input=json.dumps({"mode": mode, "cases": specs}), capture_output=True,
                       text=True, timeout=timeout, cwd=self.base,
                       env={"PATH": "/usr/bin:/bin", "HOME": self.base, "LANG": "C.UTF-8",
                            "PYTHONPATH": os.path.join(self.base, "pkg"), "TMPDIR": tmpdir or "/tmp"})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if "error" in out:
      raise SandboxUnavailableError(out["error"])
    return out["results"]

  def close(self):
    shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="module")
def nobody():
  if not IS_ROOT or not all(shutil.which(t) for t in ("unshare", "setpriv", "mount")):
    pytest.skip("running as an unprivileged user needs root and util-linux unshare/setpriv")
  runner = _NobodyRunner()
  yield runner
  runner.close()


COMBOS = ([("root", "root"), ("root", "rlimits"), ("nobody", "userns"), ("nobody", "rlimits")]
          if IS_ROOT else [("self", "userns"), ("self", "rlimits")])
STRONG = [c for c in COMBOS if c[1] != "rlimits"]


def _run_combo(user, mode, specs, request, tmpdir=None):
  if user == "nobody":
    try:
      return request.getfixturevalue("nobody").run(mode, specs, tmpdir=tmpdir)
    except SandboxUnavailableError as e:
      pytest.skip(f"mode {mode!r} unavailable as uid {NOBODY}: {e}")
  if not _mode_works(mode):
    pytest.skip(f"mode {mode!r} unavailable here: {sandbox._probed.get(mode)}")
  if tmpdir is not None:
    request.getfixturevalue("monkeypatch").setattr(tempfile, "tempdir", tmpdir)
  return sandbox_hostile.run_cases(mode, specs)


@pytest.mark.parametrize("user,mode", STRONG)
def test_no_host_sockets_ipc_files_and_a_work_dir_quota(user, mode, request, tmp_path):
  """Regression (issue 36): sandboxed code connected to a 0666 host Unix socket (by path and abstract),
  attached to a 0666 SysV shared-memory segment, and wrote 1 GB / 30k files into the host's /tmp."""
  shared = tempfile.mkdtemp(prefix="fineflax_hostile_")  # reachable by uid 65534 too
  os.chmod(shared, 0o777)
  tmpdir = os.path.join(shared, "tmp")  # where the sandbox's temp dirs go: watched for the disk probes
  os.mkdir(tmpdir, 0o777)
  outside_file = os.path.join(shared, "public.txt")
  with open(outside_file, "w") as f:
    f.write("HOST FILE")
  os.chmod(outside_file, 0o644)
  abstract = f"fineflax-hostile-{uuid.uuid4().hex}"
  shm = sandbox_hostile.SysvShm()
  servers = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)]
  try:
    servers[0].bind(os.path.join(shared, "host.sock"))
    os.chmod(os.path.join(shared, "host.sock"), 0o666)
    servers[1].bind("\0" + abstract)
    for server in servers:
      server.listen(4)
      server.settimeout(0.2)
    specs = sandbox_hostile.isolation_cases(os.path.join(shared, "host.sock"), abstract, shm.key, outside_file)
    with sandbox_hostile.PeakBytes(tmpdir) as peak:
      res = _run_combo(user, mode, specs, request, tmpdir=tmpdir)
    for server in servers:
      with pytest.raises(socket.timeout):
        server.accept()
    out = {name: r[1] for name, r in res.items()}
    lines = out["unix_sockets"].splitlines()
    assert len(lines) == 2 and all(line.startswith("refused") for line in lines), res["unix_sockets"]
    assert "ATTACHED" not in out["sysv_shm"] and "denied" in out["sysv_shm"], res["sysv_shm"]
    assert shm.content() == b"HOSTDATA"
    assert "HOST FILE" not in out["read_outside"] and "denied" in out["read_outside"], res["read_outside"]
    words = out["disk_fill"].split()
    assert words[0] == "stopped" and int(words[1]) <= sandbox.MAX_DISK_MB and words[2] == "28", res["disk_fill"]
    words = out["many_files"].split()
    assert words[0] == "stopped" and int(words[1]) <= sandbox.MAX_FILES and words[2] == "28", res["many_files"]
    assert peak.value < 4 << 20, f"{peak.value} bytes appeared in the host's temp dir"
  finally:
    for server in servers:
      server.close()
    shm.close()
    shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.fast
def test_bwrap_mode_is_refused_with_the_replacement_named():
  with pytest.raises(SandboxUnavailableError, match="userns"):
    run_python("print(1)", mode="bwrap")


@pytest.mark.parametrize("user,mode", COMBOS)
def test_hostile_programs_are_contained(user, mode, request):
  outside = tempfile.mkdtemp(prefix="fineflax_outside_")
  os.chmod(outside, 0o777)  # writable by anyone: only the read-only mount can stop the write
  token = f"1000.{uuid.uuid4().int % 10 ** 9}"
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    specs = sandbox_hostile.cases(outside, server.getsockname()[1], token)
    try:
      res = _run_combo(user, mode, specs, request)
      server.settimeout(0.2)
      with pytest.raises(socket.timeout):
        server.accept()
      escaped = sandbox_hostile.cmdlines_with(token)
      weak = mode == "rlimits"
      assert sandbox_hostile.bounded_contained(res["bounded_fork"][1]), res["bounded_fork"]
      rc, _, _, timed_out, seconds = res["infinite_loop"]
      assert timed_out and rc == -9 and seconds < 3.0
      words = res["memory_bomb"][1].split()
      assert words[0] == "capped" and int(words[1]) <= 128, res["memory_bomb"]
      allocated = res["memory_bomb_forked"][1].count("allocated")
      if user == "root" and _cgroup_memory_writable():  # 4 x 90 MB > the run's 128 MB cgroup
        assert allocated < 4, res["memory_bomb_forked"]
      assert "refused" in res["network"][1] and "CONNECTED" not in res["network"][1], res["network"]
      if not (weak and user != "root"):  # documented: rlimits without root cannot find setsid escapees,
        # and uid 65534's leftover processes count against its RLIMIT_NPROC there, so its fork may fail
        assert "parent done" in res["setsid_escape"][1]
        assert not escaped, f"setsid escapee still alive: {escaped}"
      if not weak:
        assert not os.path.exists(os.path.join(outside, "escaped.txt"))
        err = res["write_outside"][2]  # the host folder is not there (new root), or read-only
        assert "inside.txt" not in err and ("No such file" in err or "Read-only" in err), err
      if not (weak and user == "root"):  # documented: rlimits as root can read root's files
        assert "denied" in res["read_root"][1], res["read_root"]
    finally:
      for pid in sandbox_hostile.cmdlines_with(token):
        os.kill(pid, 9)
      shutil.rmtree(outside, ignore_errors=True)


@pytest.mark.parametrize("user,mode", COMBOS)
def test_fork_bomb_keeps_host_process_count_and_load_bounded(user, mode, request):
  """Bounded bomb first (stops at 40 forks), the true bomb only if that was contained; /proc sampled."""
  specs = {"bounded_fork": [sandbox_hostile.BOUNDED_FORK, {"timeout_s": 5.0,
                                                           "max_processes": sandbox_hostile.MAX_PROCESSES}],
           "fork_bomb": [sandbox_hostile.FORK_BOMB, {"timeout_s": 2.0,
                                                     "max_processes": sandbox_hostile.MAX_PROCESSES}]}
  with open("/proc/loadavg") as f:
    load_before = float(f.read().split()[0])
  baseline, peak, stop = _procs(), [0], threading.Event()

  def sample():
    while not stop.is_set():
      peak[0] = max(peak[0], _procs())
      time.sleep(0.005)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  try:
    res = _run_combo(user, mode, specs, request)
  finally:
    stop.set()
    sampler.join()
  assert sandbox_hostile.bounded_contained(res["bounded_fork"][1]), res["bounded_fork"]
  rc, _, _, timed_out, seconds = res["fork_bomb"]
  assert rc is not None, res["fork_bomb"]
  assert timed_out and seconds < 2.0 + 3.0
  # the runner, its supervisor and <= MAX_PROCESSES sandboxed processes, plus other activity on the host
  print(f"fork bomb {user}/{mode}: host processes {baseline} -> peak {peak[0]}, load {load_before}")
  assert peak[0] - baseline <= sandbox_hostile.MAX_PROCESSES + 100, (baseline, peak[0])  # escaped: thousands
  with open("/proc/loadavg") as f:
    assert float(f.read().split()[0]) <= load_before + 4.0
  time.sleep(0.05)
  if user == "root":  # no live process of any sandbox uid is left
    assert not _uid_pids(lambda uid: uid >= sandbox._UID_BASE)
  elif user == "nobody":
    assert not _uid_pids(lambda uid: uid == NOBODY)


def _venv(tmp_root, copies, src):
  """A venv of this interpreter whose fineflax (the sandbox modules, copied to the private dir `src`) comes
  from an editable-style .pth."""
  base_python = os.path.join(*sandbox._interpreter())
  subprocess.run([base_python, "-m", "venv", "--without-pip"] + (["--copies"] if copies else []) + [tmp_root],
                 check=True, capture_output=True)
  site = subprocess.run([os.path.join(tmp_root, "bin", "python"), "-c",
                         "import site; print(site.getsitepackages()[0])"],
                        check=True, capture_output=True, text=True).stdout.strip()
  _standalone_sandbox(src)
  with open(os.path.join(site, "__editable__.fineflax.pth"), "w") as f:  # what an editable install adds
    f.write(src + "\n")


@pytest.mark.skipif(not IS_ROOT, reason="the 'root' mode needs root")
@pytest.mark.parametrize("copies", [False, True])
def test_root_mode_runs_from_venvs_in_private_dirs(copies):
  """Regression: from a venv under a 0700 dir (mkdtemp; reached through a symlink) the 'root' mode failed to
  start the interpreter and the sandbox silently fell back to a mode that does not bind root."""
  private = tempfile.mkdtemp(prefix="fineflax_home_")  # 0700, like /root
  link_dir = tempfile.mkdtemp(prefix="fineflax_link_")
  try:
    venv = os.path.join(private, "venv")
    _venv(venv, copies, os.path.join(private, "src"))
    os.symlink(venv, os.path.join(link_dir, "venv"))
    code = ("from fineflax.rewards.sandbox import run_python\n"
            "r = run_python('import os; print(os.getuid(), 6 * 7)', mode='auto')\nprint(r.stdout, r.stderr)\n")
    out = subprocess.run([os.path.join(link_dir, "venv", "bin", "python"), "-c", code], capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, cwd=link_dir)
    assert out.returncode == 0, out.stderr[-2000:]
    uid, answer = out.stdout.split()[:2]
    assert answer == "42" and int(uid) >= sandbox._UID_BASE  # ran in 'root' mode, as a sandbox uid
  finally:
    shutil.rmtree(private, ignore_errors=True)
    shutil.rmtree(link_dir, ignore_errors=True)


def test_unavailable_mode_is_an_error_not_a_fallback(monkeypatch):
  """If the strong mode cannot start, a run (and a code reward in scoring) raises, naming the fix."""
  monkeypatch.setattr(sandbox, "_probed", {})
  monkeypatch.setattr(sandbox, "SYS_MOUNT_SETATTR", 10 ** 6)  # ENOSYS: namespace setup fails
  monkeypatch.setattr(sandbox.shutil, "which", lambda name, *a, **k: None)  # and no bubblewrap
  monkeypatch.delenv(sandbox.ENV_VAR, raising=False)
  if not (IS_ROOT or _mode_works("userns")):
    pytest.skip("no strong mode on this machine")
  with pytest.raises(SandboxUnavailableError, match=r"cannot start.*FINEFLAX_SANDBOX=rlimits"):
    run_python("print(1)")
  completion = "```python\ndef f():\n    return 1\n```"
  with pytest.raises(SandboxUnavailableError):
    score_completions({"code": 1.0}, [""], [completion], [{"tests": ["assert f() == 1"]}])
  monkeypatch.setenv(sandbox.ENV_VAR, "rlimits")  # opting into the weak mode by name works
  if _mode_works("rlimits"):
    assert run_python("print(6 * 7)").stdout.strip() == "42"
  with pytest.raises(ValueError, match="FINEFLAX_SANDBOX"):
    run_python("print(1)", mode="chroot")
  if IS_ROOT:
    with pytest.raises(SandboxUnavailableError, match="RLIMIT_NPROC does not bind root"):
      run_python("print(1)", mode="userns")


@pytest.mark.fast
def test_plain_program_output_and_returncode():
  r = run_python("import sys; print(6 * 7); sys.exit(3)", timeout_s=5)
  assert (r.returncode, r.stdout.strip(), r.timed_out) == (3, "42", False)


def test_memory_limit_raises_memory_error():
  r = run_python("b = bytearray(10 * 1024 ** 3)\nprint('allocated')", timeout_s=5, memory_mb=256)
  assert "allocated" not in r.stdout and "MemoryError" in r.stderr and r.returncode != 0


@pytest.mark.skipif(not IS_ROOT, reason="cgroups are only used as root")
def test_root_without_writable_cgroups(monkeypatch):
  """No writable cgroup (e.g. read-only /sys/fs/cgroup): 'root' still bounds processes (fresh uid +
  RLIMIT_NPROC, PID namespace); 'rlimits' as root refuses to run, since nothing would bound a fork bomb."""
  monkeypatch.setattr(sandbox.cgroups, "create", lambda *a, **k: None)
  monkeypatch.setattr(sandbox, "_probed", {})
  if not _mode_works("root"):
    pytest.skip("'root' mode unavailable here")
  r = run_python(sandbox_hostile.BOUNDED_FORK, timeout_s=5.0, max_processes=sandbox_hostile.MAX_PROCESSES)
  assert sandbox_hostile.bounded_contained(r.stdout), r
  assert not _uid_pids(lambda uid: uid >= sandbox._UID_BASE)
  with pytest.raises(SandboxUnavailableError, match="no writable pids cgroup"):
    run_python("print(1)", mode="rlimits")
