"""`--api-procs`: the HTTP front ends in processes of their own (`serve.split`, `serve.remote`). The link protocol on
a fake engine over a real pipe (fast); a real engine's events through the link equal its events in process; the
server as processes: the same greedy answers as one process, /health of both processes, a clean stop, a lost front
end restarted while the engine serves on, and past --api-restarts the server stops."""
import multiprocessing as mp
import os
import signal
import threading
import time

import pytest

from fineflax.serve.engine import Job
from fineflax.serve.limits import Limits
from fineflax.serve.remote import RemoteEngine
from fineflax.serve.split import FrontEndLink
from fineflax.serve.waiting import QueueFull

LIMITS = Limits(context=64, slots=2, page_size=16, pool_pages=16, adapters=("alpha",))


class FakeEngine:
  """What FrontEndLink needs of `serve.engine.Engine`: a job whose prompt starts with 7 is refused (queue full),
  with 8 gets a ValueError; any other gets one delta and its n ends at once."""

  def __init__(self):
    self.limits, self.cancelled, self.jobs = LIMITS, [], []

  def submit(self, job):
    if job.prompt[0] == 7:
      raise QueueFull("the server is at capacity", 3)
    if job.prompt[0] == 8:
      raise ValueError("bad job")
    self.jobs.append(job)
    for i in range(job.n):
      job.emit(("delta", i, f"text{i}", [(5, -0.5)]))
      job.emit(("done", i, "length", 1))

  def cancel(self, job):
    self.cancelled.append(job)

  def on_emitter_thread(self):
    return False

  def state(self):
    return {"active_rows": 0, "threads": {"fineflax-engine": 11}, "processes": {"": os.getpid()}}


def _collect():
  events, done = [], threading.Event()

  def emit(ev):
    events.append(ev)
    if ev[0] == "error" or sum(e[0] == "done" for e in events) == 2:
      done.set()
  return events, done, emit


@pytest.fixture
def linked():
  here, there = mp.Pipe(duplex=True)
  engine = FakeEngine()
  link = FrontEndLink(here, engine, "api0")
  threading.Thread(target=link.run, daemon=True).start()
  lost = threading.Event()
  remote = RemoteEngine(there, tokenizer=None, on_lost=lost.set).start()
  yield engine, link, remote, lost
  remote.stop()
  here.close()


@pytest.mark.fast
def test_api_procs_defaults_by_backend_and_refuses_negatives(capsys):
  from fineflax.serve.__main__ import parse_args
  assert parse_args(["--model", "m"]).api_procs is None  # main(): 1 on a GPU or TPU, 0 on the CPU
  assert parse_args(["--model", "m", "--api-procs", "2"]).api_procs == 2
  with pytest.raises(SystemExit):
    parse_args(["--model", "m", "--api-procs", "-1"])
  assert "--api-procs -1: must be >= 0" in capsys.readouterr().err
  assert parse_args(["--model", "m"]).api_restarts == 5
  with pytest.raises(SystemExit):
    parse_args(["--model", "m", "--api-restarts", "-2"])
  assert "--api-restarts -2: must be >= 0" in capsys.readouterr().err


@pytest.mark.fast
def test_a_job_crosses_the_link_and_its_events_come_back(linked):
  engine, _, remote, _ = linked
  assert remote.context == 64 and remote.adapter_ids == {"alpha": 0} and remote.limits == LIMITS
  events, done, emit = _collect()
  job = Job(prompt=[1, 2, 3], emit=emit, n=2, max_tokens=4, temperature=0.5, stop=("x",), seed=9, adapter="alpha")
  remote.submit(job)
  assert done.wait(10)
  assert events == [("delta", 0, "text0", [(5, -0.5)]), ("done", 0, "length", 1),
                    ("delta", 1, "text1", [(5, -0.5)]), ("done", 1, "length", 1)]
  there = engine.jobs[0]  # the engine's copy has every field the front end set
  assert (there.prompt, there.n, there.max_tokens, there.temperature, there.stop, there.seed, there.adapter) == \
      ([1, 2, 3], 2, 4, 0.5, ("x",), 9, "alpha")
  assert remote._jobs == {}  # finished jobs are forgotten on both sides


@pytest.mark.fast
def test_refusals_are_error_events_and_bad_jobs_fail_before_sending(linked):
  _, _, remote, _ = linked
  events, done, emit = _collect()
  remote.submit(Job(prompt=[7], emit=emit))
  assert done.wait(10) and events == [("error", "the server is at capacity", 429, 3)]
  events, done, emit = _collect()
  remote.submit(Job(prompt=[8], emit=emit))
  assert done.wait(10) and events == [("error", "bad job", 400)]
  with pytest.raises(ValueError, match="exceeds the context of 64"):
    remote.submit(Job(prompt=[1] * 60, emit=emit, max_tokens=10))
  with pytest.raises(ValueError, match="unknown adapter 'beta'"):
    remote.submit(Job(prompt=[1], emit=emit, adapter="beta"))


@pytest.mark.fast
def test_cancel_reaches_the_engine_and_state_names_both_processes(linked):
  engine, _, remote, _ = linked
  job = Job(prompt=[1], emit=lambda ev: None)
  engine.submit = lambda j: engine.jobs.append(j)  # admitted, never ends
  remote.submit(job)
  remote.cancel(job)
  deadline = time.time() + 10
  while time.time() < deadline and not engine.cancelled:
    time.sleep(0.01)
  assert job.cancelled and [j.prompt for j in engine.cancelled] == [[1]]
  st = remote.state()
  assert st["threads"]["engine:fineflax-engine"] == 11
  assert st["processes"] == {"engine": os.getpid(), "api0": os.getpid()}
  assert "api0:fineflax-link" in st["threads"]


@pytest.mark.fast
def test_a_lost_engine_fails_the_jobs_in_flight():
  here, there = mp.Pipe(duplex=True)
  FrontEndLink(here, FakeEngine(), "api0")  # sends the hello; nothing reads its end
  lost = threading.Event()
  remote = RemoteEngine(there, tokenizer=None, on_lost=lost.set).start()
  events, done, emit = _collect()
  remote.submit(Job(prompt=[1], emit=emit))
  here.close()
  assert done.wait(10) and lost.wait(10)
  assert events == [("error", "the engine process is gone")]


def test_a_real_engines_events_through_the_link_equal_its_own(tmp_path):
  from fineflax.serve.__main__ import parse_args
  from fineflax.serve.build import build_engine, check_args
  from fineflax.testing.serve import server_argv, tiny_chat_model
  args = parse_args(server_argv(tiny_chat_model(tmp_path), {}, tmp_path / "log.sqlite", 0, "--no-warmup"))
  engine = build_engine(args, check_args(args))
  here, there = mp.Pipe(duplex=True)
  link = FrontEndLink(here, engine, "api0")
  engine.after_emit = link.flush
  engine.start()
  threading.Thread(target=link.run, daemon=True).start()
  remote = RemoteEngine(there, engine.tokenizer).start()
  try:
    runs = []
    for target in (engine, remote):
      events, done = [], threading.Event()

      def emit(ev, events=events, done=done):
        events.append(ev)
        if ev[0] == "error" or sum(e[0] == "done" for e in events) == 2:
          done.set()
      target.submit(Job(prompt=[1, 5, 9, 300], emit=emit, n=2, max_tokens=12, temperature=0.8, seed=3,
                        stop=("e",)))
      assert done.wait(120)
      runs.append(events)
    assert runs[1] == runs[0] and any(e[0] == "delta" and e[2] for e in runs[0])
  finally:
    remote.stop()
    engine.stop()


@pytest.fixture(scope="module")
def split_server(tmp_path_factory):
  from fineflax.testing.serve import free_port, server_argv, start_subprocess_server, tiny_chat_model
  root = tmp_path_factory.mktemp("split")
  model = tiny_chat_model(root)
  argv = server_argv(model, {}, root / "log.sqlite", free_port(), "--no-warmup")
  proc, url = start_subprocess_server(argv + ["--api-procs", "2"], timeout=300)
  yield proc, url, argv
  if proc.poll() is None:
    proc.kill()


def test_split_server_answers_as_one_process_and_reports_both(split_server):
  import openai
  from fineflax.serve.spawn import health
  from fineflax.testing.serve import free_port, thread_server
  proc, url, argv = split_server
  msg = [{"role": "user", "content": "What is 2 + 3?"}]
  kw = dict(model="tiny", messages=msg, max_tokens=12, temperature=0)
  client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
  answer = client.chat.completions.create(**kw)
  streamed = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(**kw, stream=True)
                     if ch.choices)
  one_argv = list(argv)  # the same server in one process, on another port and log
  one_argv[argv.index("--port") + 1] = str(free_port())
  one_argv[argv.index("--log") + 1] = argv[argv.index("--log") + 1] + ".one"
  with thread_server(one_argv) as (one_url, _):
    one = openai.OpenAI(base_url=one_url + "/v1", api_key="x", max_retries=0, timeout=120)
    expected = one.chat.completions.create(**kw)
  assert answer.choices[0].message.content == expected.choices[0].message.content == streamed
  assert answer.usage == expected.usage
  h = health(url)
  assert set(h["processes"]) == {"engine", "api0", "api1"} and h["processes"]["engine"] == proc.pid
  assert "engine:fineflax-engine" in h["threads"]
  assert {h["threads"][f"api{i}:MainThread"] for i in (0, 1)} == {h["processes"]["api0"], h["processes"]["api1"]}
  assert h["decode_calls"] >= 2 and h["generated_tokens_total"] >= 2 * answer.usage.completion_tokens


def test_split_server_restarts_a_dead_front_end_then_stops_past_the_limit_and_on_sigterm(tmp_path):
  import openai
  from fineflax.serve.spawn import health
  from fineflax.testing.serve import free_port, server_argv, start_subprocess_server, tiny_chat_model
  argv = server_argv(tiny_chat_model(tmp_path), {}, tmp_path / "log.sqlite", free_port(), "--no-warmup",
                     "--api-procs", "1", "--api-restarts", "1")
  proc, url = start_subprocess_server(argv, timeout=300)
  first = health(url)
  assert first["front_end_restarts"] == 0
  os.kill(first["processes"]["api0"], signal.SIGKILL)
  client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
  answer = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          temperature=0)  # served by the restarted front end
  assert answer.usage.completion_tokens >= 1 and proc.poll() is None
  second = health(url)
  assert second["front_end_restarts"] == 1 and second["processes"]["engine"] == first["processes"]["engine"]
  assert second["processes"]["api0"] != first["processes"]["api0"]
  os.kill(second["processes"]["api0"], signal.SIGKILL)  # a second exit within the minute: past --api-restarts 1
  assert proc.wait(timeout=60) == 1
  argv[argv.index("--port") + 1] = str(free_port())
  proc, url = start_subprocess_server(argv, timeout=300)
  front = health(url)["processes"]["api0"]
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=60) == 0
  with pytest.raises(ProcessLookupError):
    for _ in range(100):  # the front end is gone too
      os.kill(front, 0)
      time.sleep(0.1)
