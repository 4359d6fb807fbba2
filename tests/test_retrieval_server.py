"""The Search-R1 retrieval server on 127.0.0.1 (ephemeral ports, bounded loops): schema, keep-alive without a
Nagle stall, idle and half-open connections, concurrency, chunked and oversized bodies, malformed requests,
the cap on queries per request and fair turns for big requests, and the command line (port checked before
the index is built, corpus errors by file line)."""
import concurrent.futures
import http.client
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import threading
import time

import pytest

from fineflax.testing.retrieval import SlowEngine
from retrieval.documents import read_jsonl
from retrieval.engine import create_search_engine
from retrieval.server import RetrievalHTTPError, RetrievalServer, retrieve_http

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [{"id": f"d{i}", "title": f"Topic {i}", "text": f"cells protein {i % 7} glucose word{i}"} for i in range(60)]
DOCS[5] = {"id": "p5", "title": "Amyloid", "text": "Amyloid fibrils build up in Alzheimer brains."}


@pytest.fixture(scope="module")
def engine():
  return create_search_engine("bm25", DOCS)


@pytest.fixture(scope="module")
def server(engine):
  with RetrievalServer(engine, "127.0.0.1", 0, workers=2, idle_timeout=1.0, keep_alive_timeout=5.0,
                       max_body_bytes=4096) as srv:
    yield srv


def _conn(server, timeout=10.0):
  return http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=timeout)


def _post(conn, body, headers=None, path="/retrieve", method="POST"):
  conn.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
  r = conn.getresponse()
  return r.status, json.loads(r.read() or b"null")


def _ask(queries, topk=3, **extra):
  return json.dumps({"queries": queries, "topk": topk, **extra})


@pytest.mark.fast
def test_search_r1_schema_and_null_topk(server, engine):
  result = retrieve_http(server.url, ["amyloid fibrils", "glucose"], topk=2)
  expected = engine.search("amyloid fibrils", 2)
  assert [r["document"]["id"] for r in result[0]] == [h.id for h in expected] and len(result[1]) == 2
  assert result[0][0]["document"]["contents"] == '"Amyloid"\nAmyloid fibrils build up in Alzheimer brains.'
  assert result[0][0]["score"] == pytest.approx(expected[0].score)
  conn = _conn(server)
  status, body = _post(conn, _ask(["protein"], None, return_scores=True))  # Search-R1: Optional[int] = None
  assert status == 200 and len(body["result"][0]) == 3  # the server's default topk
  status, body = _post(conn, json.dumps({"queries": ["protein"]}))
  assert status == 200 and set(body["result"][0][0]) == {"id", "contents"}  # return_scores defaults to false
  assert _post(conn, _ask([]))[1] == {"result": []}
  assert len(_post(conn, _ask(["cells"], 10**9))[1]["result"][0]) == len(DOCS) - 1  # all with "cells"


def test_keep_alive_without_nagle_stall(server):
  """One query per request over one connection: no ~40 ms Nagle/delayed-ACK stall per request (the old
  http.server wrote headers and body separately: ~22 req/s)."""
  conn = _conn(server)
  latencies, sockets = [], set()
  for i in range(30):
    start = time.perf_counter()
    status, _ = _post(conn, _ask([f"protein {i}"]))
    latencies.append(time.perf_counter() - start)
    sockets.add(id(conn.sock))
    assert status == 200
  assert len(sockets) == 1  # the same connection throughout
  assert statistics.median(latencies) < 0.025, latencies


def test_idle_and_half_open_connections_do_not_starve(server, engine):
  """24 silent or half-sent connections (more than the worker threads) do not delay a normal request."""
  idle = []
  try:
    for i in range(24):
      s = socket.create_connection(("127.0.0.1", server.server_port), timeout=5)
      if i % 3 == 1:
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")  # headers never finished
      elif i % 3 == 2:
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"quer")  # body cut
      idle.append(s)
    start = time.perf_counter()
    result = retrieve_http(server.url, ["amyloid"], topk=1, timeout=5)
    assert result[0][0]["document"]["id"] == "p5" and time.perf_counter() - start < 1.0
  finally:
    for s in idle:
      s.close()


@pytest.mark.parametrize("sent", [b"", b"POST /retrieve HTTP/1.1\r\nHost: x\r\n",
                                  b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"q"])
def test_silent_connection_is_closed_after_idle_timeout(server, sent):
  with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as s:
    s.sendall(sent)
    start = time.perf_counter()
    assert s.recv(1024) == b""  # EOF: the server closed it (idle_timeout = 1 s)
    assert 0.5 < time.perf_counter() - start < 4.0


def test_many_concurrent_clients(server, engine):
  queries = [f"word{i} protein" for i in range(48)]

  def client(q):
    conn = _conn(server)
    out = [_post(conn, _ask([q], 2)) for _ in range(3)]
    conn.close()
    return out

  with concurrent.futures.ThreadPoolExecutor(48) as pool:
    results = list(pool.map(client, queries))
  for q, replies in zip(queries, results):
    expected = [h.id for h in engine.search(q, 2)]
    assert all(status == 200 and [d["id"] for d in body["result"][0]] == expected for status, body in replies)


def test_chunked_body_is_accepted(server):
  conn = _conn(server)
  body = _ask(["amyloid fibrils"], 1).encode()
  conn.request("POST", "/retrieve", iter([body[:7], body[7:20], body[20:]]), encode_chunked=True)
  r = conn.getresponse()
  assert r.status == 200 and json.loads(r.read())["result"][0][0]["id"] == "p5"


def test_too_large_body_gets_413_and_connection_survives(server):
  conn = _conn(server)
  big = _ask(["x" * 20_000]).encode()  # limit 4096 bytes
  status, body = _post(conn, big)
  assert status == 413 and "4096" in body["error"]
  status, _ = _post(conn, _ask(["amyloid"]))  # same connection: the rest of the body was read, not left
  assert status == 200
  conn.request("POST", "/retrieve", iter([big[i:i + 1000] for i in range(0, len(big), 1000)]), encode_chunked=True)
  r = conn.getresponse()
  assert r.status == 413 and "4096" in json.loads(r.read())["error"]
  assert _post(conn, _ask(["amyloid"]))[0] == 200


@pytest.mark.fast
@pytest.mark.parametrize("body, field", [
    (b'{"queries": ["x"', "malformed JSON"), (b"\xff\xfe", "malformed JSON"), (b"[1, 2]", "JSON object"),
    (b'{"queries": "x"}', "'queries'"), (b'{"queries": [1]}', "'queries'"), (b'{"queries": ["x"], "topk": 0}', "'topk'"),
    (b'{"queries": ["x"], "topk": "3"}', "'topk'"), (b'{"queries": ["x"], "topk": true}', "'topk'"),
    (b'{"queries": ["x"], "return_scores": "yes"}', "'return_scores'"),
    (b"[" * 2000 + b"]" * 2000, "nested too deeply")])  # deeper than the JSON parser's recursion limit
def test_malformed_json_gets_400_and_server_keeps_answering(server, body, field):
  conn = _conn(server)
  status, reply = _post(conn, body)
  assert status == 400 and field in reply["error"]
  assert _post(conn, _ask(["amyloid"]))[0] == 200


def test_over_limit_body_reaches_urllib_as_413(server):
  """urllib sends `Connection: close`: the server still reads the whole over-limit body before answering,
  so the client sees the 413 (before: a broken pipe / connection reset)."""
  with pytest.raises(RetrievalHTTPError, match="HTTP 413.*4096") as err:
    retrieve_http(server.url, ["x" * 20_000_000], timeout=30)
  assert err.value.status == 413
  with pytest.raises(RetrievalHTTPError, match="HTTP 400.*'topk'") as err:
    retrieve_http(server.url, ["amyloid"], topk=0)
  assert err.value.status == 400


def test_queries_per_request_are_capped_and_searched_in_batches(engine):
  queries = [f"protein word{i}" for i in range(7)]
  with RetrievalServer(engine, "127.0.0.1", 0, max_queries=5, batch_queries=2) as srv:
    conn = _conn(srv)
    status, body = _post(conn, _ask(queries[:6], 2))
    assert status == 413 and "6 queries" in body["error"] and "limit of 5" in body["error"]
    status, body = _post(conn, _ask(queries[:5], 2))  # three engine calls (2 + 2 + 1), answers in order
    assert status == 200
    expected = [[h.id for h in row] for row in engine.search_batch(queries, 2)]
    assert [[d["id"] for d in row] for row in body["result"]] == expected[:5]
    got = retrieve_http(srv.url, queries, topk=2, max_queries=5)  # the client splits: 5 + 2
    assert [[r["document"]["id"] for r in row] for row in got] == expected


def test_a_small_request_does_not_wait_for_big_ones(engine):
  """One worker, two requests of 300 queries (3 s of engine time each), then one query: it waits for at
  most a batch of each (2 x 8 x 10 ms), not for both big requests (before: >= 3 s)."""
  slow = SlowEngine(engine, per_query=0.01)
  with RetrievalServer(slow, "127.0.0.1", 0, workers=1, batch_queries=8) as srv:
    durations = []

    def big():
      start = time.perf_counter()
      assert len(retrieve_http(srv.url, [f"glucose {i}" for i in range(300)], timeout=60)) == 300
      durations.append(time.perf_counter() - start)
    threads = [threading.Thread(target=big) for _ in range(2)]
    for t in threads:
      t.start()
    time.sleep(0.5)  # both big requests are in (one searching, one waiting for the worker)
    start = time.perf_counter()
    assert retrieve_http(srv.url, ["amyloid"], topk=1, timeout=60)[0][0]["document"]["id"] == "p5"
    small = time.perf_counter() - start
    for t in threads:
      t.join(60)
  assert len(durations) == 2 and small < 0.25 * min(durations), (small, durations)


@pytest.mark.parametrize("raw, status", [
    (b"GARBAGE\r\n\r\n", 400), (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
    (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n", 400),
    (b"GET /retrieve HTTP/1.1\r\nHost: x\r\n\r\n", 405), (b"POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 404)])
def test_malformed_http_gets_4xx(server, raw, status):
  with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as s:
    s.sendall(raw)
    assert s.recv(4096).split(b"\r\n")[0].startswith(b"HTTP/1.1 %d" % status)
  assert retrieve_http(server.url, ["amyloid"], topk=1, timeout=5)[0][0]["document"]["id"] == "p5"


def _cli(*args, timeout=120):
  env = {**os.environ, "PYTHONPATH": str(ROOT)}
  return subprocess.run([sys.executable, "-m", "retrieval.server", *args], capture_output=True, text=True,
                        timeout=timeout, env=env, cwd=ROOT)


def test_help_documents_the_server():
  out = _cli("--help")
  assert out.returncode == 0
  for words in ("POST /retrieve", "keep-alive", "--idle-timeout", "--workers", "413", "chunked", "--topk",
                "--max-queries", "--batch-queries"):
    assert words in out.stdout, words


def test_busy_port_fails_before_building_the_index(tmp_path):
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    # The corpus does not exist: had the index been built first, the error would be about the corpus.
    out = _cli("--corpus", str(tmp_path / "missing.jsonl"), "--kind", "bm25", "--port", str(port))
  assert out.returncode == 2 and "Traceback" not in out.stderr
  assert out.stderr.strip().count("\n") == 0 and f"127.0.0.1:{port}" in out.stderr and "in use" in out.stderr


def test_duplicate_corpus_id_names_the_file_line(tmp_path):
  corpus = tmp_path / "kb.jsonl"
  corpus.write_text('{"id": "a", "text": "x"}\n\n{"id": "b", "text": "y"}\n{"id": "a", "text": "z"}\n')
  with pytest.raises(ValueError, match=rf"kb.jsonl:4: duplicate id 'a' \(first at .*kb.jsonl:1\)"):
    read_jsonl(corpus)
  (tmp_path / "bad.jsonl").write_text('{"id": "a", "text": "x"}\n{"id": "b"}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:2: no 'text'"):
    read_jsonl(tmp_path / "bad.jsonl")
  out = _cli("--corpus", str(corpus), "--kind", "bm25", "--port", "0")
  assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.strip().count("\n") == 0
  assert "kb.jsonl:4: duplicate id 'a'" in out.stderr


def test_cli_kinds_match_the_engine():
  from retrieval import engine, server
  assert server.KINDS == engine.KINDS
