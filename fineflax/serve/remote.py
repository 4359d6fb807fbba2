"""The engine of another process, as a front end sees it: `RemoteEngine` has what `serve.app.Server` needs of
`serve.engine.Engine` (submit, cancel, state, start, stop, tokenizer, context, adapter_ids) over one duplex
`multiprocessing` connection to `serve.split.FrontEndLink`.

Messages (pickled tuples). Front end -> engine: ("submit", jid, job fields), ("cancel", jid), ("state", rid).
Engine -> front end: ("hello", {"limits": Limits fields, "pid": pid}) once, ("events", [(jid, event), ...]) (a
decode chunk's events of this front end's jobs in one message), ("state", rid, `Engine.state()`).

A job is checked here (`serve.limits.Limits.check`: 400s need no round trip); a full waiting queue comes back as
the job's first event, ("error", message, 429, retry_after), which the app answers as the in-process server's
`QueueFull` (429 + Retry-After). When the engine process goes, every job in flight ends with a 500 error event and
`on_lost` runs (the front end's process then stops: `serve.split`).
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import traceback

from fineflax.serve.engine import Job
from fineflax.serve.limits import Limits

JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job)  # what a submit message carries
                   if f.name not in ("emit", "cancelled", "texts", "rows", "remote_id"))


def note_event(jobs: dict, jid: int, ev):
  """The entry [job, rows done] of `jid` in `jobs` (None if it is not there) as `ev` reaches it: an ("error", ...)
  or the job's n-th ("done", ...) removes it, an earlier "done" is counted. Both ends of a link keep their jobs so
  (the caller holds its lock)."""
  entry = jobs.get(jid)
  if entry is not None and (ev[0] == "error" or (ev[0] == "done" and entry[1] + 1 == entry[0].n)):
    del jobs[jid]
  elif entry is not None and ev[0] == "done":
    entry[1] += 1
  return entry


class RemoteEngine:
  """`serve.engine.Engine`'s surface for the app, over `conn` (module docstring). name: this front end's prefix of
  /health's thread names ("api0")."""

  def __init__(self, conn, tokenizer, *, name: str = "api0", on_lost=None, state_timeout: float = 30.0):
    self.conn, self.tokenizer, self.name, self.on_lost = conn, tokenizer, name, on_lost
    kind, hello = conn.recv()
    if kind != "hello":
      raise RuntimeError(f"the engine process sent {kind!r} first, not 'hello'")
    self.limits, self.engine_pid = Limits(**hello["limits"]), hello["pid"]
    self.context, self.slots = self.limits.context, self.limits.slots
    self.adapter_ids = {name: i for i, name in enumerate(self.limits.adapters)}
    self.state_timeout = state_timeout
    self._ids = itertools.count()
    self._jobs: dict = {}  # jid -> [job, rows done]
    self._replies: dict = {}  # rid -> [threading.Event, reply]
    self._send_lock, self._lock = threading.Lock(), threading.Lock()
    self._reader: threading.Thread | None = None
    self._closed = False

  def _send(self, msg) -> None:
    with self._send_lock:
      self.conn.send(msg)

  def submit(self, job: Job) -> None:
    """Checks the job (ValueError as `Engine.submit`) and sends it; its events come back to job.emit."""
    self.limits.check(job)
    jid = next(self._ids)
    job.remote_id = jid
    with self._lock:
      self._jobs[jid] = [job, 0]
    try:
      self._send(("submit", jid, {k: getattr(job, k) for k in JOB_FIELDS}))
    except (OSError, ValueError) as e:  # the engine process is gone (or the connection closed)
      with self._lock:
        self._jobs.pop(jid, None)
      raise RuntimeError(f"the engine process is not reachable: {e}") from None

  def cancel(self, job: Job) -> None:
    job.cancelled = True
    jid = job.remote_id
    if jid is not None and not self._closed:
      try:
        self._send(("cancel", jid))
      except (OSError, ValueError):
        pass

  def state(self) -> dict:
    """The engine process's `Engine.state()`, its threads named "engine:thread", this process's "<name>:thread",
    and every front end's main thread "apiK:MainThread" (a main thread's native id is its pid); "processes" maps
    "engine" and each front end's name to its pid. Blocks: call it from a worker thread."""
    rid, wait = next(self._ids), [threading.Event(), None]
    with self._lock:
      self._replies[rid] = wait
    self._send(("state", rid))
    if not wait[0].wait(self.state_timeout):
      with self._lock:
        self._replies.pop(rid, None)
      raise TimeoutError(f"the engine process did not answer a state request in {self.state_timeout:g} s")
    st = dict(wait[1])
    front_ends = {**st.pop("front_ends", {}), self.name: os.getpid()}
    st["threads"] = {**{f"engine:{k}": v for k, v in st["threads"].items()},
                     **{f"{name}:MainThread": pid for name, pid in front_ends.items()},
                     **{f"{self.name}:{t.name}": t.native_id for t in threading.enumerate()}}
    st["processes"] = {"engine": self.engine_pid, **front_ends}
    return st

  def start(self) -> "RemoteEngine":
    if self._reader is None:
      self._reader = threading.Thread(target=self._read_loop, name="fineflax-link", daemon=True)
      self._reader.start()
    return self

  def stop(self) -> None:
    self._closed = True
    try:
      self.conn.close()
    except OSError:
      pass

  # -- reader thread -----------------------------------------------------------------------------
  def _read_loop(self) -> None:
    try:
      while True:
        msg = self.conn.recv()
        if msg[0] == "events":
          self._deliver(msg[1])
        elif msg[0] == "state":
          with self._lock:
            wait = self._replies.pop(msg[1], None)
          if wait is not None:
            wait[1] = msg[2]
            wait[0].set()
    except (EOFError, OSError):
      pass
    self._lost()

  def _deliver(self, items) -> None:
    for jid, ev in items:
      with self._lock:
        entry = note_event(self._jobs, jid, ev)
      if entry is None or entry[0].cancelled:
        continue
      try:
        entry[0].emit(ev)
      except Exception:  # this job's client is gone: the others go on
        traceback.print_exc()

  def _lost(self) -> None:
    """The connection ended: every job in flight gets a 500 error event; then `on_lost` (unless `stop` closed it)."""
    with self._lock:
      jobs, self._jobs = self._jobs, {}
    for job, _ in jobs.values():
      if not job.cancelled:
        try:
          job.emit(("error", "the engine process is gone"))
        except Exception:
          traceback.print_exc()
    if not self._closed and self.on_lost is not None:
      self.on_lost()
