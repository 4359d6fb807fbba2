"""`python -m fineflax.serve --api-procs K`: the engine in this process, the HTTP front ends in K processes of their
own.

Why: a process's threads share one GIL. At 128 streaming clients (SmolLM2-135M, one H200) the event loop needs ~22 ms
of CPU a decode chunk of ~15.5 ms, and the engine thread waits for the GIL between chunks (benchmarks/RESULTS.md,
session_2026_11_29d). As vLLM's API-server / engine-core split, the engine process keeps the engine thread, the
emitter (detokenising, stop strings) and one link thread per front end; a front end runs uvicorn and the app
(parsing, chat template, tokenising, server-sent events, the answer log, the router) on a `serve.remote.RemoteEngine`:

  engine process (this one)                        front end i (spawned; JAX on the CPU, no weights)
  Engine + FrontEndLink i  <-- duplex pipe -->     RemoteEngine -> serve.app.Server -> uvicorn on the shared socket
    link thread: submit / cancel / state              link thread: events -> job.emit (the event loop's outbox)
    emitter: a chunk's events, one message a link

The listening socket is bound once, before the weights load, and shared: the kernel hands each new connection to one
front end. Each front end keeps its own answer-log writer (one SQLite file in WAL mode) and its own router: with
K > 1 a front end's bandit learns from the feedback it receives (the log holds all of it; a restart loads all).
A front end that exits is restarted in place (`--api-restarts` R times a minute over all front ends, then the server
stops with exit status 1, for a supervisor to restart it whole): its link cancels its jobs, whose clients lose their
connections; the engine, the other front ends and their clients go on; /health counts `front_end_restarts`.
SIGTERM or SIGINT: the front ends stop (uvicorn's graceful shutdown), then the engine.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import os
import signal
import sys
import threading
import time
import traceback

from fineflax.serve.engine import Engine, Job
from fineflax.serve.remote import note_event
from fineflax.serve.waiting import QueueFull


RESTART_WINDOW_S = 60.0  # --api-restarts counts the restarts of the last minute


@dataclasses.dataclass
class FrontEnds:
  """The supervisor's view that state replies report: {name: pid} of the live front ends, restarts so far."""
  pids: dict = dataclasses.field(default_factory=dict)
  restarts: int = 0


class FrontEndLink:
  """The engine process's end of one front end's pipe (`serve.remote` gives the messages). The jobs it submits post
  their events here; events posted on the emitter thread wait for `flush` (after the chunk's last), the others
  (errors from the engine thread, refusals) go at once."""

  def __init__(self, conn, engine: Engine, name: str, front_ends: "FrontEnds | None" = None):
    self.conn, self.engine, self.name = conn, engine, name
    self.front_ends = FrontEnds() if front_ends is None else front_ends  # every front end (state replies)
    self._jobs: dict = {}  # jid -> [job, rows done]
    self._pending: list = []
    self._lock, self._send_lock = threading.Lock(), threading.Lock()
    self._send(("hello", {"limits": dataclasses.asdict(engine.limits), "pid": os.getpid()}))

  def _send(self, msg) -> None:
    with self._send_lock:
      try:
        self.conn.send(msg)
      except (OSError, ValueError):  # the front end is gone: its link thread ends and cancels its jobs
        pass

  def post(self, jid: int, ev) -> None:
    with self._lock:
      self._pending.append((jid, ev))
      note_event(self._jobs, jid, ev)
    if not self.engine.on_emitter_thread():
      self.flush()

  def flush(self) -> None:
    with self._lock:
      items, self._pending = self._pending, []
    if items:
      self._send(("events", items))

  def run(self) -> None:
    """The link thread: the front end's messages until its pipe closes; then its jobs are cancelled."""
    try:
      while True:
        msg = self.conn.recv()
        try:
          self._handle(msg)
        except Exception:  # a bad message fails itself, not the link
          traceback.print_exc()
    except (EOFError, OSError):
      pass
    self.conn.close()
    with self._lock:
      jobs, self._jobs = self._jobs, {}
    for job, _ in jobs.values():
      self.engine.cancel(job)

  def _handle(self, msg) -> None:
    if msg[0] == "submit":
      jid, fields = msg[1], msg[2]
      job = Job(**fields, emit=functools.partial(self.post, jid))
      with self._lock:
        self._jobs[jid] = [job, 0]
      try:
        self.engine.submit(job)
      except QueueFull as e:
        self.post(jid, ("error", str(e), 429, e.retry_after))
      except ValueError as e:
        self.post(jid, ("error", str(e), 400))
    elif msg[0] == "cancel":
      with self._lock:
        entry = self._jobs.pop(msg[1], None)
      if entry is not None:
        self.engine.cancel(entry[0])
    elif msg[0] == "state":
      self._send(("state", msg[1], {**self.engine.state(), "front_ends": dict(self.front_ends.pids),
                                    "front_end_restarts": self.front_ends.restarts}))
    else:
      raise ValueError(f"front end {self.name}: unknown message {msg[0]!r}")


def front_end_main(args, conn, sock, name: str, server_parts: tuple) -> None:
  """A front end's process: the app on a `RemoteEngine` over `conn`, served by uvicorn on the shared socket.
  server_parts: (base name, auto variants, RagConfig | None) from `build.check_args`."""
  os.environ["JAX_PLATFORMS"] = "cpu"  # this process never computes on a device (and takes none of its memory)
  import uvicorn
  from fineflax.models import load_tokenizer
  from fineflax.serve.build import SWITCH_INTERVAL_S, build_server
  from fineflax.serve.app import uvicorn_config
  from fineflax.serve.remote import RemoteEngine
  sys.setswitchinterval(SWITCH_INTERVAL_S)  # the link thread gets the GIL back soon after a chunk's events arrive
  engine = RemoteEngine(conn, load_tokenizer(args.model), name=name,
                        on_lost=lambda: os.kill(os.getpid(), signal.SIGTERM))
  _, app = build_server(args, engine, *server_parts)
  uvicorn.Server(uvicorn_config(app, args.host, sock.getsockname()[1], keep_alive_timeout=args.keep_alive_timeout,
                                idle_timeout=args.idle_timeout)).run(sockets=[sock])


def _interrupt(signum, frame):
  raise KeyboardInterrupt


def _start_front_end(ctx, args, sock, name: str, server_parts: tuple, engine: Engine, front_ends: FrontEnds):
  """(process, link) of a new front end `name` on `sock`; its link thread is started by the caller."""
  here, there = ctx.Pipe(duplex=True)
  proc = ctx.Process(target=front_end_main, args=(args, there, sock, name, server_parts), name=f"fineflax-{name}",
                     daemon=True)
  proc.start()
  there.close()
  front_ends.pids[name] = proc.pid
  return proc, FrontEndLink(here, engine, name, front_ends)


def _run_link(link: FrontEndLink) -> None:
  threading.Thread(target=link.run, name=f"fineflax-link-{link.name}", daemon=True).start()


def serve_split(args, engine: Engine, sock, server_parts: tuple) -> int:
  """Serves with `engine` in this process and `args.api_procs` front-end processes on `sock` (module docstring)
  until a signal (0) or more than `args.api_restarts` front-end exits within `RESTART_WINDOW_S` (1)."""
  import multiprocessing as mp
  from multiprocessing.connection import wait
  from fineflax.serve.feedback import FeedbackLog
  # the log's file, WAL mode and schema (its migration of an older file) made once, before front ends open it at once
  FeedbackLog(args.log, synchronous=args.log_sync, reward_range=(args.reward_min, args.reward_max)).close()
  ctx = mp.get_context("spawn")
  front_ends = FrontEnds()
  procs, links = map(list, zip(*[_start_front_end(ctx, args, sock, f"api{i}", server_parts, engine, front_ends)
                                 for i in range(args.api_procs)]))
  engine.after_emit = lambda: [link.flush() for link in list(links)]
  engine.start()
  for link in links:
    _run_link(link)
  old = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
  status, recent = 0, collections.deque()
  try:
    while status == 0:
      wait([p.sentinel for p in procs])
      for i, p in enumerate(procs):
        if p.is_alive():
          continue
        name, now = links[i].name, time.monotonic()
        while recent and now - recent[0] > RESTART_WINDOW_S:
          recent.popleft()
        if len(recent) >= args.api_restarts:
          print(f"fineflax.serve: front end {name} exited (code {p.exitcode}) after {len(recent)} restarts in "
                f"{RESTART_WINDOW_S:g} s (--api-restarts {args.api_restarts}); stopping", file=sys.stderr, flush=True)
          status = 1
          break
        recent.append(now)
        front_ends.restarts += 1
        print(f"fineflax.serve: front end {name} exited (code {p.exitcode}); restarting it", file=sys.stderr,
              flush=True)
        procs[i], links[i] = _start_front_end(ctx, args, sock, name, server_parts, engine, front_ends)
        _run_link(links[i])
  except KeyboardInterrupt:
    pass
  finally:
    for s, h in old.items():
      signal.signal(s, h)
    for p in procs:
      if p.is_alive():
        p.terminate()  # SIGTERM: uvicorn finishes the requests in flight
    for p in procs:
      p.join(timeout=30)
      if p.is_alive():
        p.kill()
    engine.stop()
  return status
