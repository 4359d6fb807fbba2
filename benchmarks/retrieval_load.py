"""Load test of `python -m retrieval.server` (127.0.0.1 only, bounded loops) and FAISS thread timings;
run through benchmarks/retrieval.py (--part server / faiss).

Server rows: one keep-alive client sending one query per request; a new connection per request; 64
concurrent keep-alive clients; a normal request's latency with 0 vs 32 idle connections open (16 silent,
16 with half-sent headers); malformed requests (each must get a 4xx and be followed by a 200).
"""
from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]

MALFORMED = [
    ("invalid JSON", b"POST /retrieve HTTP/1.1\r\nHost: b\r\nContent-Length: 5\r\n\r\n{\"que"),
    ("queries not a list", b"POST /retrieve HTTP/1.1\r\nHost: b\r\nContent-Length: 16\r\n\r\n{\"queries\": \"x\"}"),
    ("topk 0", b'POST /retrieve HTTP/1.1\r\nHost: b\r\nContent-Length: 29\r\n\r\n{"queries": ["x"], "topk": 0}'),
    ("non-UTF-8 body", b"POST /retrieve HTTP/1.1\r\nHost: b\r\nContent-Length: 2\r\n\r\n\xff\xfe"),
    ("garbage request line", b"GARBAGE\r\n\r\n"),
    ("bad Content-Length", b"POST /retrieve HTTP/1.1\r\nHost: b\r\nContent-Length: abc\r\n\r\n"),
    ("bad chunk size", b"POST /retrieve HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n"),
    ("GET /retrieve", b"GET /retrieve HTTP/1.1\r\nHost: b\r\n\r\n"),
    ("unknown path", b"POST /nope HTTP/1.1\r\nHost: b\r\nContent-Length: 2\r\n\r\n{}"),
    ("9 MiB body (limit 8)", b"POST /retrieve HTTP/1.1\r\nHost: b\r\nContent-Length: 9437184\r\n\r\n" + b" " * 9437184),
]


def start_server(docs: list[dict], kind: str = "bm25", workers: int = 2):
  """Starts the server in a subprocess on a free 127.0.0.1 port; returns (process, port, temp dir)."""
  tmp = tempfile.TemporaryDirectory()
  corpus = pathlib.Path(tmp.name) / "corpus.jsonl"
  corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
  env = {**os.environ, "PYTHONPATH": str(ROOT)}
  proc = subprocess.Popen([sys.executable, "-m", "retrieval.server", "--corpus", str(corpus), "--kind", kind,
                           "--port", "0", "--workers", str(workers)], stderr=subprocess.PIPE, text=True, env=env)
  deadline = time.time() + 300
  while time.time() < deadline:
    line = proc.stderr.readline()
    if not line and proc.poll() is not None:
      raise RuntimeError(f"server exited with {proc.returncode}")
    if line.startswith("serving"):
      return proc, int(line.rsplit(":", 1)[1].split("/")[0]), tmp
  proc.kill()
  raise RuntimeError("server did not start in 300 s")


def _post(conn: http.client.HTTPConnection, query: str) -> int:
  conn.request("POST", "/retrieve", json.dumps({"queries": [query], "topk": 3, "return_scores": True}),
               {"Content-Type": "application/json"})
  r = conn.getresponse()
  r.read()
  return r.status


def _stats(latencies: list[float]) -> tuple[float, float]:
  ms = np.asarray(latencies) * 1e3
  return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def cpu_seconds(pid: int, tid: int | None = None) -> float:
  """User + system CPU seconds of process pid so far (clock ticks), or of its thread tid (a native id; its
  nanoseconds on a CPU from schedstat where the kernel keeps them); Linux /proc, nan elsewhere or for a thread
  that has ended."""
  try:
    if tid is not None and os.path.exists(f"/proc/{pid}/task/{tid}/schedstat"):
      return int(pathlib.Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = pathlib.Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
  except (OSError, IndexError, ValueError):
    return float("nan")


def keep_alive_client(port: int, queries: list[str], n: int, runs: int = 3) -> list:
  """`runs` runs of n requests over one connection; req/s is the median run (and the best run)."""
  conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
  for q in queries[:50]:
    _post(conn, q)  # warm-up
  lat, errors, rates = [], 0, []
  for _ in range(runs):
    start = time.perf_counter()
    for i in range(n):
      t = time.perf_counter()
      errors += _post(conn, queries[i % len(queries)]) != 200
      lat.append(time.perf_counter() - t)
    rates.append(n / (time.perf_counter() - start))
  conn.close()
  return ["1 keep-alive client, 1 query/request", 1, n * runs, errors, float(np.median(rates)), max(rates),
          *_stats(lat)]


def new_connection_client(port: int, queries: list[str], n: int) -> list:
  lat, errors = [], 0
  start = time.perf_counter()
  for i in range(n):
    t = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    errors += _post(conn, queries[i % len(queries)]) != 200
    conn.close()
    lat.append(time.perf_counter() - t)
  rate = n / (time.perf_counter() - start)
  return ["new connection per request", 1, n, errors, rate, rate, *_stats(lat), lat]


def concurrent_clients(port: int, queries: list[str], clients: int, per_client: int) -> list:
  def client(c):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    out = []
    for i in range(per_client):
      t = time.perf_counter()
      try:
        ok = _post(conn, queries[(c * per_client + i) % len(queries)]) == 200
      except (OSError, http.client.HTTPException):
        ok = False
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
      out.append((ok, time.perf_counter() - t))
    conn.close()
    return out

  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(clients) as pool:
    results = [r for rs in pool.map(client, range(clients)) for r in rs]
  elapsed = time.perf_counter() - start
  errors = sum(not ok for ok, _ in results)
  rate = len(results) / elapsed
  return [f"{clients} concurrent keep-alive clients", clients, len(results), errors, rate, rate,
          *_stats([t for _, t in results])]


def idle_connections(port: int, queries: list[str], idle: int, n: int, rounds: int = 5) -> list[list]:
  """Normal requests (new connection each) without and with `idle` connections open (half silent, half
  with headers never finished), alternating in `rounds` blocks so that drift in machine load hits both."""
  blocks: dict[bool, list] = {False: [], True: []}
  for _ in range(rounds):
    for with_idle in (False, True):
      sockets = []
      try:
        for i in range(idle if with_idle else 0):
          s = socket.create_connection(("127.0.0.1", port), timeout=10)
          if i % 2:
            s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: b\r\n")
          sockets.append(s)
        blocks[with_idle].append(new_connection_client(port, queries, n // rounds))
      finally:
        for s in sockets:
          s.close()
  rows = []
  for with_idle, label in ((False, "no idle connections"), (True, f"{idle} idle connections open")):
    lat = [x for b in blocks[with_idle] for x in b[-1]]
    rate = float(np.median([b[4] for b in blocks[with_idle]]))
    rows.append([f"new connection per request, {label}", 1 + idle * with_idle, n, sum(b[3] for b in blocks[with_idle]),
                 rate, max(b[4] for b in blocks[with_idle]), *_stats(lat)])
  return rows


def malformed(port: int) -> tuple[list, list[str]]:
  """Sends each malformed request on its own connection; returns (row, notes of any failure)."""
  ok4xx, followed, notes = 0, 0, []
  for name, raw in MALFORMED:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
      try:
        s.sendall(raw)
        status = int(s.recv(4096).split(b" ", 2)[1])
      except (OSError, ValueError, IndexError) as e:
        status, _ = 0, notes.append(f"{name}: {type(e).__name__}")
    ok4xx += 400 <= status < 500
    if not 400 <= status < 500:
      notes.append(f"{name}: status {status}")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    followed += _post(conn, "protein folding") == 200
    conn.close()
  return [f"malformed requests ({len(MALFORMED)} kinds)", 1, len(MALFORMED), len(MALFORMED) - ok4xx,
          float("nan"), float("nan"), float("nan"), float("nan")], [f"4xx: {ok4xx}/{len(MALFORMED)}, a normal request "
                                                       f"answered after each: {followed}/{len(MALFORMED)}", *notes]


def server_rows(docs: list[dict], queries: list[str], n: int = 2000) -> tuple[list[list], list[str]]:
  proc, port, tmp = start_server(docs)
  try:
    cpu = cpu_seconds(proc.pid)
    rows = [keep_alive_client(port, queries, n)]
    rows[-1].append(1e3 * (cpu_seconds(proc.pid) - cpu) / rows[-1][2])  # server CPU ms per request
    for fn in (lambda: new_connection_client(port, queries, n // 4)[:-1],
               lambda: concurrent_clients(port, queries, 64, 20)):
      cpu = cpu_seconds(proc.pid)
      rows.append(fn())
      rows[-1].append(1e3 * (cpu_seconds(proc.pid) - cpu) / rows[-1][2])
    rows += [r + [float("nan")] for r in idle_connections(port, queries, 32, 400)]
    row, notes = malformed(port)
    rows.append(row + [float("nan")])
  finally:
    proc.terminate()
    proc.wait(30)
    tmp.cleanup()
  return rows, notes


def faiss_rows(vectors: np.ndarray, name: str, batch_sizes=(1, 4, 16, 64, 256), budget_s: float = 2.0) -> list[list]:
  """Median seconds per DenseIndex.search call (k=10) with 1 thread, the default count, and the library's
  per-call choice (threads_for)."""
  from retrieval.dense import DenseIndex
  from retrieval.threads import default_threads, threads_for
  index = DenseIndex(vectors.shape[1], "flat")
  index.add([str(i) for i in range(len(vectors))], vectors)
  rng = np.random.default_rng(0)
  rows = []
  for nq in batch_sizes:
    q = vectors[rng.integers(0, len(vectors), nq)] + 0.05 * rng.standard_normal((nq, vectors.shape[1])).astype(np.float32)
    cell = {}
    for label, threads in (("1", 1), ("default", default_threads()), ("auto", None)):
      index.search(q, 10, threads=threads)
      times, start = [], time.perf_counter()
      while not times or (time.perf_counter() - start < budget_s and len(times) < 200):
        t = time.perf_counter()
        index.search(q, 10, threads=threads)
        times.append(time.perf_counter() - t)
      cell[label] = float(np.median(times)) * 1e3
    rows.append([name, len(vectors), nq, cell["1"], cell["default"], threads_for(nq, *vectors.shape), cell["auto"],
                 cell["default"] / cell["1"]])
  return rows
