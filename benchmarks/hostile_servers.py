"""Hostile or unlucky clients against the two HTTP servers (issue 36): each probe says what it expects and
what it saw.

  python -m benchmarks.hostile_servers        # prints the rows as a Markdown table (CPU, about 1-2 min)
  from benchmarks.hostile_servers import probes; probes() -> [{area, probe, expected, seen, ok}, ...]

Chat server: `python -m fineflax.serve` in a subprocess over a tiny random Llama with SmolLM2's tokenizer
and two random LoRA adapters (fineflax/testing/serve.py), 2 slots, context 256, --idle-timeout 1, on a
reward log left as an older server could have left it (a reward of 1e200 among alpha's zeros, +-inf, NULL
and text rewards). Retrieval server: in this process, BM25 over 200 documents with the engine slowed to
5 ms per query (what a dense engine costs on a CPU), 1 worker, --max-queries 500, --batch-queries 16,
--idle-timeout 1. Everything listens on 127.0.0.1 only, every loop is bounded, both servers stop at the end.
"""
from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from benchmarks._hostile_rows import row


CHAT, RETRIEVAL = "chat server", "retrieval server"
IDLE_S = 1.0
MSG = [{"role": "user", "content": "What is 2 + 3?"}]


def _request(url, body=None, raw=None, method=None, timeout=60.0):
  """(status, parsed JSON or None) of one urllib request (urllib sends `Connection: close`)."""
  data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
  req = urllib.request.Request(url, data=data, method=method or ("GET" if data is None else "POST"),
                               headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(req, timeout=timeout) as r:
      status, text = r.status, r.read()
  except urllib.error.HTTPError as e:
    status, text = e.code, e.read()
  try:
    return status, json.loads(text)
  except ValueError:
    return status, None


def _closed_after(port, sent: bytes, limit: float) -> float | None:
  """Seconds until the server closes a connection that sent `sent` and then nothing; None if still open
  after `limit` s."""
  with socket.create_connection(("127.0.0.1", port), timeout=limit) as s:
    s.sendall(sent)
    start = time.perf_counter()
    try:
      return time.perf_counter() - start if s.recv(1024) == b"" else None
    except ConnectionResetError:
      return time.perf_counter() - start
    except socket.timeout:
      return None


def _idle_probes(area, port, path, extra_headers=b""):
  rows = []
  cases = [("silent connection (nothing sent)", b""),
           ("half-sent headers", b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n"),
           ("half-sent body", b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n" + extra_headers +
            b"Content-Length: 60\r\n\r\n{\"mo")]
  for name, sent in cases:
    took = _closed_after(port, sent, 4 * IDLE_S + 5)
    rows.append(row(area, name, f"closed after --idle-timeout {IDLE_S:g} s",
                    "still open" if took is None else f"closed after {took:.1f} s",
                    took is not None and took < 4 * IDLE_S + 2))
  return rows


def _health_under_big_prompts(url, body, clients=2, each=2):
  """(statuses of the big requests, /health latencies while they were in flight)."""
  statuses, latencies = [], []
  senders = [threading.Thread(target=lambda: statuses.extend(
      _request(url + "/v1/chat/completions", body, timeout=120)[0] for _ in range(each))) for _ in range(clients)]
  for t in senders:
    t.start()
  deadline = time.time() + 120
  while any(t.is_alive() for t in senders) and time.time() < deadline:
    start = time.perf_counter()
    _request(url + "/health", timeout=30)
    latencies.append(time.perf_counter() - start)
    time.sleep(0.01)
  for t in senders:
    t.join(5)
  return statuses, latencies


# -- chat server ---------------------------------------------------------------------------------------
def _seed_old_log(path):
  """A reward log as an older server (no range check) could have left it."""
  from fineflax.serve.feedback import FeedbackLog
  log = FeedbackLog(path)
  rewards = {"alpha": [1e200] + [0.0] * 9, "beta": [0.9] * 10, "tiny": [0.5] * 10}
  for variant, values in rewards.items():
    log.add_responses([{"id": f"old-{variant}", "variant": variant, "request": {}, "messages": [],
                        "answer": "", "settings": {}}])
    for r in values + [float("inf"), float("-inf"), None, "lots"]:
      log.db.execute("INSERT INTO feedback(response_id, reward, created) VALUES (?, ?, 0)", (f"old-{variant}", r))
  log.close()


@contextlib.contextmanager
def chat_server(root: pathlib.Path):
  from fineflax.testing.serve import free_port, server_argv, start_subprocess_server, tiny_chat_model, write_adapters
  model = tiny_chat_model(root)
  adapters = write_adapters(model, root)
  log = root / "old_log.sqlite"
  _seed_old_log(log)
  port = free_port()
  proc, url = start_subprocess_server(server_argv(model, adapters, log, port, "--idle-timeout", str(IDLE_S)))
  try:
    yield url, port
  finally:
    proc.terminate()
    try:
      proc.wait(30)
    except Exception:  # noqa: BLE001 - it would not stop: kill it
      proc.kill()
      proc.wait(30)


def chat_probes() -> list[dict]:
  import openai
  rows = []
  with tempfile.TemporaryDirectory(prefix="hostile_chat_") as tmp, chat_server(pathlib.Path(tmp)) as (url, port):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    warm = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=4, temperature=0)  # compiles

    ok = {"model": "tiny", "messages": MSG, "max_tokens": 2}
    malformed = [
        dict(raw=b"{not json"), dict(raw=b"[1, 2]"), dict(body={**ok, "model": "nope"}),
        dict(body={k: v for k, v in ok.items() if k != "model"}), dict(body={**ok, "messages": []}),
        dict(body={**ok, "messages": "hi"}), dict(body={**ok, "messages": [{"role": "robot", "content": "x"}]}),
        dict(body={**ok, "messages": [{"role": "user", "content": 5}]}), dict(body={**ok, "max_tokens": -5}),
        dict(body={**ok, "max_tokens": 10_000}), dict(body={**ok, "temperature": "hot"}),
        dict(body={**ok, "temperature": 9}), dict(body={**ok, "top_p": 0}), dict(body={**ok, "n": 100}),
        dict(body={**ok, "seed": "x"}), dict(body={**ok, "stop": ""}), dict(body={**ok, "stop": [""]}),
        dict(body={**ok, "stop": ["a"] * 5}), dict(body={**ok, "stop": 3}), dict(body={**ok, "top_logprobs": 5}),
        dict(body={**ok, "stream_options": "x"}),
        dict(body={**ok, "messages": [{"role": "user", "content": "x" * 20}] * 40}),  # over the context
        dict(raw=b'{"model": "tiny", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),  # nested deep
        dict(raw=b'{"model": "tiny", "pad": "' + b"x" * (3 << 20) + b'"}'),  # over --max-body-bytes
    ]
    answers = [_request(url + "/v1/chat/completions", **kw) for kw in malformed]
    good = [s for s, b in answers if 400 <= s < 500 and isinstance(b, dict)
            and b.get("error", {}).get("type") == "invalid_request_error"]
    rows.append(row(CHAT, f"{len(malformed)} malformed chat requests (bad JSON, nesting 100k deep, fields, "
                    "3 MB body)", "each a JSON 4xx, type invalid_request_error",
                    f"{len(good)}/{len(malformed)}; statuses {sorted({s for s, _ in answers})}",
                    len(good) == len(malformed)))

    chunks, errors = [], []

    def long_stream():
      try:
        chunks.extend(client.chat.completions.create(
            model="tiny", messages=MSG, max_tokens=150, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
      except Exception as e:  # noqa: BLE001 - shown in the row
        errors.append(e)
    stream = threading.Thread(target=long_stream)
    stream.start()
    deadline = time.time() + 30
    while time.time() < deadline and not _request(url + "/health")[1]["active_rows"]:
      time.sleep(0.02)
    bad = [_request(url + "/v1/chat/completions", {**ok, "stop": stop})[0] for stop in ([""], "")]
    stream.join(120)
    tokens = chunks[-1].usage.completion_tokens if chunks and chunks[-1].usage else None
    rows.append(row(CHAT, 'stop=[""] and stop="" while a 150-token ignore_eos stream runs',
                    "400 each; the stream ends normally with 150 tokens",
                    f"{bad}; stream: {tokens} tokens, errors {[type(e).__name__ for e in errors]}",
                    bad == [400, 400] and tokens == 150 and not errors))

    big = {"model": "tiny", "messages": [{"role": "user", "content": "hello world " * 85_000}]}
    statuses, latencies = _health_under_big_prompts(url, big)
    p50 = statistics.median(latencies) if latencies else float("nan")
    rows.append(row(CHAT, "2 clients x 2 prompts of ~1 MB, /health polled meanwhile",
                    "400 (over max_prompt_chars, before tokenising); /health p50 < 0.1 s",
                    f"{statuses}; /health p50 {1000 * p50:.1f} ms over {len(latencies)} checks",
                    statuses == [400] * 4 and p50 < 0.1))

    status, body = _request(url + "/feedback", {"id": warm.id, "reward": 1e200})
    rows.append(row(CHAT, "feedback with reward 1e200", "400 naming the range [-1, 1]",
                    f"{status}: {(body or {}).get('error', {}).get('message', body)}",
                    status == 400 and "[-1, 1]" in str(body)))
    status, stats = _request(url + "/rl/stats")
    alpha = (stats or {}).get("variants", {}).get("alpha", {})
    rows.append(row(CHAT, "/rl/stats after a restart on a log with 1e200, +-inf, NULL, text rewards",
                    "200; alpha's 1e200 clipped to 1 (mean 0.1), non-numbers skipped",
                    f"{status}; alpha feedback {alpha.get('feedback')}, mean {alpha.get('mean_reward')}",
                    status == 200 and alpha.get("feedback") == 10 and abs(alpha.get("mean_reward", 9) - 0.1) < 1e-9))
    routed = client.chat.completions.create(model="auto", messages=MSG, max_tokens=1).model
    rows.append(row(CHAT, "model=auto on that log (alpha: 1e200 + nine 0s; beta 0.9s; tiny 0.5s)",
                    "beta (one huge reward does not dominate)", routed, routed == "beta"))

    rows += _idle_probes(CHAT, port, b"/v1/chat/completions")
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(300)]
    try:
      start = time.perf_counter()
      status = _request(url + "/health", timeout=30)[0]
      took = time.perf_counter() - start
      time.sleep(IDLE_S + 1.5)
      closed = 0
      for s in silent:
        s.settimeout(0.5)
        with contextlib.suppress(OSError):
          closed += s.recv(1) == b""
    finally:
      for s in silent:
        s.close()
    rows.append(row(CHAT, "300 silent connections, then a new client",
                    f"the client is served at once; the server closes all 300 within {IDLE_S + 1.5:g} s",
                    f"{status} in {1000 * took:.0f} ms; {closed} closed", status == 200 and took < 2 and closed == 300))

    stream = client.chat.completions.create(model="beta", messages=MSG, max_tokens=150, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    busy = _request(url + "/health")[1]["active_rows"]
    stream.close()
    deadline, rows_now = time.time() + 30, busy
    while time.time() < deadline and rows_now:
      time.sleep(0.05)
      rows_now = _request(url + "/health")[1]["active_rows"]
    rows.append(row(CHAT, "a streaming client disconnects after its first chunk", "its slot is freed",
                    f"active rows {busy} -> {rows_now}", busy == 1 and rows_now == 0))
  return rows


# -- retrieval server ----------------------------------------------------------------------------------
def retrieval_probes() -> list[dict]:
  from fineflax.testing.retrieval import SlowEngine
  from retrieval.engine import create_search_engine
  from retrieval.server import RetrievalHTTPError, RetrievalServer, retrieve_http
  docs = [{"id": f"d{i}", "title": f"Topic {i}", "text": f"cells protein {i % 7} glucose word{i}"}
          for i in range(200)]
  engine = SlowEngine(create_search_engine("bm25", docs), per_query=0.005)
  rows = []
  with RetrievalServer(engine, "127.0.0.1", 0, workers=1, idle_timeout=IDLE_S, max_queries=500,
                       batch_queries=16) as srv:
    url, port = srv.url, srv.server_port
    malformed = [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"queries": "x"}', b'{"queries": [1]}',
                 b'{"queries": ["x"], "topk": 0}', b'{"queries": ["x"], "topk": "3"}',
                 b'{"queries": ["x"], "return_scores": "yes"}', b"[" * 100_000 + b"]" * 100_000]
    answers = [_request(url, raw=raw) for raw in malformed]
    answers += [_request(url, method="GET"), _request(url.replace("/retrieve", "/nope"), raw=b"{}")]
    good = [s for s, b in answers if 400 <= s < 500 and isinstance(b, dict) and b.get("error")]
    rows.append(row(RETRIEVAL, f"{len(answers)} malformed requests (bad JSON, nesting 100k deep, fields, "
                    "method, path)", "each a JSON 4xx", f"{len(good)}/{len(answers)}; statuses "
                    f"{sorted({s for s, _ in answers})}", len(good) == len(answers)))
    uvicorn_log = logging.getLogger("uvicorn.error")
    level, _ = uvicorn_log.level, uvicorn_log.setLevel(logging.ERROR)  # its warning is this probe's point
    try:
      with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GARBAGE\r\n\r\n")
        line = s.recv(4096).split(b"\r\n")[0].decode(errors="replace")
    finally:
      uvicorn_log.setLevel(level)
    rows.append(row(RETRIEVAL, "malformed HTTP request line", "HTTP 400", line, line.startswith("HTTP/1.1 400")))

    try:
      retrieve_http(url, ["x" * 20_000_000], timeout=60)
      seen, ok = "no error", False
    except RetrievalHTTPError as e:
      seen, ok = f"RetrievalHTTPError status {e.status}", e.status == 413
    except Exception as e:  # noqa: BLE001 - shown in the row
      seen, ok = f"{type(e).__name__}: {e}", False
    rows.append(row(RETRIEVAL, "retrieve_http with a 20 MB body (limit 8 MB; urllib sends Connection: close)",
                    "RetrievalHTTPError with status 413 (not a reset)", seen, ok))

    status, body = _request(url, {"queries": ["protein"] * 501})
    rows.append(row(RETRIEVAL, "501 queries in one request (--max-queries 500)", "413 naming the count and cap",
                    f"{status}: {(body or {}).get('error')}", status == 413 and "501" in str(body)
                    and "500" in str(body)))

    durations = []

    def big():
      start = time.perf_counter()
      retrieve_http(url, [f"glucose {i}" for i in range(500)], timeout=120)
      durations.append(time.perf_counter() - start)
    threads = [threading.Thread(target=big) for _ in range(2)]
    for t in threads:
      t.start()
    time.sleep(0.5)
    start = time.perf_counter()
    retrieve_http(url, ["protein"], topk=1, timeout=120)
    small = time.perf_counter() - start
    for t in threads:
      t.join(120)
    rows.append(row(RETRIEVAL, "1 query behind 2 requests of 500 queries (5 ms each, 1 worker)",
                    "waits for at most a batch of each (16 x 5 ms), not 2.5-5 s",
                    f"{1000 * small:.0f} ms; the big ones took {', '.join(f'{d:.1f}' for d in durations)} s",
                    len(durations) == 2 and small < 0.25 * min(durations)))
    rows += _idle_probes(RETRIEVAL, port, b"/retrieve")
  return rows


def probes() -> list[dict]:
  """Both servers' rows: {area, probe, expected, seen, ok} (a probe that crashed is a row with ok False)."""
  rows = []
  for area, run in ((CHAT, chat_probes), (RETRIEVAL, retrieval_probes)):
    try:
      rows += run()
    except Exception as e:  # noqa: BLE001 - a crashed probe run is a result too
      rows.append(row(area, "probe run", "completes", f"{type(e).__name__}: {e}", False))
  return rows


def markdown(rows: list[dict]) -> str:
  from benchmarks._results import markdown_table
  cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")
  return markdown_table(["area", "probe", "expected", "seen", "ok"],
                        [[cell(r["area"]), cell(r["probe"]), cell(r["expected"]), cell(r["seen"]),
                          "yes" if r["ok"] else "**NO**"] for r in rows])


if __name__ == "__main__":
  table_rows = probes()
  print(markdown(table_rows))
  sys.exit(0 if all(r["ok"] for r in table_rows) else 1)
