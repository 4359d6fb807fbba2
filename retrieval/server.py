"""Search-R1 retrieval server: Starlette on uvicorn (httptools), the schema of Search-R1's own retriever.

  POST /retrieve {"queries": [str, ...], "topk": 3 | null, "return_scores": true}
    -> {"result": [[{"document": {"id", "contents": "\\"Title\\"\\ntext"}, "score": s}, ...], ...]}
    (return_scores false or absent: each inner list holds the documents alone; topk null or absent: --topk)
  GET /health -> {"status": "ok", "documents": N}

Connections: HTTP/1.1 keep-alive (TCP_NODELAY, so one query per request does not wait on Nagle + delayed
ACK); an idle keep-alive connection closes after --keep-alive-timeout s; a connection that sends nothing,
half a request line/headers, or half a body for --idle-timeout s is closed (it never holds a worker: the
event loop serves every connection). Searches run on --workers threads (the rest wait, first come first
served), --batch-queries queries per engine call: a request of many queries takes its turn again after
each batch, so a small request waits behind at most one batch of each big one. A request of more than
--max-queries queries gets 413; beyond --max-connections open connections new requests get 503. Bodies
may be chunked; a body over --max-body-mb gets 413 without the server closing the connection (the rest is
read and discarded, so a client still streaming it sees the 413, not a broken pipe). Errors are JSON
{"error": message}: 400 malformed JSON (also nested too deeply) or fields, 404 unknown path, 405 wrong
method, 413 body or query list too large, 500 engine failure; malformed HTTP gets uvicorn's 400. Exit
code 2 with one line for a user mistake (port in use, bad corpus); --verbose adds tracebacks.
"""
from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
import threading
import urllib.error
import urllib.request
from typing import Any, Sequence

from retrieval.asgi import idle_timeout_protocol, parse_json, read_capped_body
from retrieval.documents import Hit

MAX_BODY_BYTES = 8 << 20
MAX_QUERIES = 1024  # queries per /retrieve request (--max-queries)
BATCH_QUERIES = 64  # queries per engine call (--batch-queries)


class BadRequest(ValueError):
  pass


def search_r1_document(h: Hit) -> dict[str, Any]:
  if "search_r1_document" in h.metadata:  # a prebuilt index's hit carries its corpus record as stored
    return h.metadata["search_r1_document"]
  return {"id": h.id, "contents": f'"{h.title}"\n{h.text}'}


def parse_request(body: bytes, default_topk: int = 3) -> tuple[list[str], int, bool]:
  """Validates a /retrieve body; topk null/absent -> default_topk; BadRequest names the field at fault."""
  try:
    payload = parse_json(body)
  except ValueError as e:
    raise BadRequest(str(e)) from None
  if not isinstance(payload, dict):
    raise BadRequest(f"body must be a JSON object, got {type(payload).__name__}")
  queries = payload.get("queries")
  if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
    raise BadRequest("field 'queries' must be a list of strings")
  topk = payload.get("topk")
  if topk is None:
    topk = default_topk
  if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
    raise BadRequest(f"field 'topk' must be an integer >= 1 or null, got {topk!r}")
  return_scores = payload.get("return_scores", False)
  if not isinstance(return_scores, bool):
    raise BadRequest(f"field 'return_scores' must be a boolean, got {return_scores!r}")
  return queries, topk, return_scores


def format_result(hits: list[list[Hit]], return_scores: bool) -> list[list[dict]]:
  if return_scores:
    return [[{"document": search_r1_document(h), "score": h.score} for h in row] for row in hits]
  return [[search_r1_document(h) for h in row] for row in hits]


def make_app(engine, *, default_topk: int = 3, max_topk: int = 1000, workers: int = 4,
             max_body_bytes: int = MAX_BODY_BYTES, max_queries: int = MAX_QUERIES,
             batch_queries: int = BATCH_QUERIES, verbose: bool = False):
  """The ASGI app: /retrieve and /health over `engine` (an object with search_batch(queries, k) and len).

  A request's queries are searched `batch_queries` at a time, each batch waiting its turn for one of the
  `workers` threads (first come, first served), so big requests take turns with small ones."""
  import anyio
  from starlette.applications import Starlette
  from starlette.exceptions import HTTPException
  from starlette.requests import ClientDisconnect, Request
  from starlette.responses import Response
  from starlette.routing import Route

  limiter = anyio.CapacityLimiter(workers)
  log = logging.getLogger("retrieval.server")

  def reply(status: int, payload: Any) -> Response:
    return Response(json.dumps(payload).encode(), status, media_type="application/json")

  async def read_body(request: Request) -> bytes | Response:
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
      return reply(400, {"error": f"bad Content-Length {declared!r}"})
    body, size = await read_capped_body(request, max_body_bytes)
    if body is None:
      return reply(413, {"error": f"body of {size} bytes exceeds the limit of {max_body_bytes}"})
    return body

  async def search(request: Request, queries: list[str], k: int) -> list[list[Hit]] | None:
    """The hits of all queries, one batch per turn on a worker; None when the client left meanwhile."""
    hits = []
    for start in range(0, len(queries), batch_queries):
      if start and await request.is_disconnected():
        return None
      hits += await anyio.to_thread.run_sync(engine.search_batch, queries[start:start + batch_queries], k,
                                             limiter=limiter)
    return hits

  async def retrieve(request: Request) -> Response:
    try:
      body = await read_body(request)
    except ClientDisconnect:
      return Response(status_code=400)  # nobody is listening
    if isinstance(body, Response):
      return body
    try:
      queries, topk, return_scores = parse_request(body, default_topk)
    except BadRequest as e:
      return reply(400, {"error": str(e)})
    if not queries:
      return reply(200, {"result": []})
    if len(queries) > max_queries:
      return reply(413, {"error": f"{len(queries)} queries in one request exceed the limit of {max_queries} "
                                  "(--max-queries); send them in several requests"})
    try:
      hits = await search(request, queries, min(topk, max_topk))
      if hits is None:
        return Response(status_code=400)  # nobody is listening
    except Exception as e:  # an engine failure is the server's fault: 500, and keep serving
      log.error("search failed", exc_info=verbose)
      return reply(500, {"error": f"{type(e).__name__}: {e}"})
    return reply(200, {"result": format_result(hits, return_scores)})

  async def health(request: Request) -> Response:
    return reply(200, {"status": "ok", "documents": len(engine)})

  async def http_error(request: Request, exc: HTTPException) -> Response:
    hint = "; use POST /retrieve or GET /health"
    return reply(exc.status_code, {"error": f"{exc.detail}: {request.method} {request.url.path!r}{hint}"})

  return Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"]), Route("/health", health, methods=["GET"])],
                   exception_handlers={HTTPException: http_error})


class PortUnavailable(OSError):
  pass


def bind_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
  """A listening TCP socket on (host, port); PortUnavailable (one line) if it cannot be had."""
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  sock = socket.socket(family, socket.SOCK_STREAM)
  try:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
  except OSError as e:
    sock.close()
    raise PortUnavailable(f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port "
                          "(0 picks a free one) or stop the process using it") from None
  sock.set_inheritable(True)
  return sock


class RetrievalServer:
  """uvicorn serving make_app(engine) on a socket bound at construction (so the port is known and checked
  before any work). serve_forever() blocks; start() runs it on a daemon thread; shutdown() stops it."""

  def __init__(self, engine, host: str = "127.0.0.1", port: int = 8000, *, sock: socket.socket | None = None,
               workers: int = 4, default_topk: int = 3, max_topk: int = 1000, max_connections: int = 1000,
               keep_alive_timeout: float = 5.0, idle_timeout: float = 10.0, max_body_bytes: int = MAX_BODY_BYTES,
               max_queries: int = MAX_QUERIES, batch_queries: int = BATCH_QUERIES, verbose: bool = False):
    import uvicorn
    self.socket = sock if sock is not None else bind_socket(host, port)
    self.host = host
    self.app = make_app(engine, default_topk=default_topk, max_topk=max_topk, workers=workers,
                        max_body_bytes=max_body_bytes, max_queries=max_queries, batch_queries=batch_queries,
                        verbose=verbose)
    config = uvicorn.Config(self.app, http=idle_timeout_protocol(idle_timeout), lifespan="off",
                            timeout_keep_alive=keep_alive_timeout, limit_concurrency=max_connections,
                            access_log=verbose, log_level="info" if verbose else "warning",
                            timeout_graceful_shutdown=5)
    self._server = uvicorn.Server(config)
    self._thread: threading.Thread | None = None

  @property
  def server_port(self) -> int:
    return self.socket.getsockname()[1]

  @property
  def url(self) -> str:
    host = f"[{self.host}]" if ":" in self.host else self.host
    return f"http://{host}:{self.server_port}/retrieve"

  def serve_forever(self) -> None:
    self._server.run(sockets=[self.socket])

  def start(self, timeout: float = 30.0) -> "RetrievalServer":
    self._thread = threading.Thread(target=self.serve_forever, name="retrieval-server", daemon=True)
    self._thread.start()
    for _ in range(int(timeout / 0.01)):
      if self._server.started or not self._thread.is_alive():
        break
      self._thread.join(0.01)
    if not self._server.started:
      raise RuntimeError(f"retrieval server did not start within {timeout:g} s")
    return self

  def shutdown(self, timeout: float = 10.0) -> None:
    self._server.should_exit = True
    if self._thread is not None:
      self._thread.join(timeout)

  def server_close(self) -> None:
    self.socket.close()

  def __enter__(self) -> "RetrievalServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.shutdown()
    self.server_close()


class RetrievalHTTPError(RuntimeError):
  """A /retrieve call that failed: `status` is the HTTP status (None when no answer came back)."""

  def __init__(self, message: str, status: int | None = None):
    super().__init__(message)
    self.status = status


def retrieve_http(url: str, queries: Sequence[str], topk: int | None = 3, return_scores: bool = True,
                  timeout: float = 60.0, max_queries: int = MAX_QUERIES) -> list[list[dict]]:
  """Client: POSTs to `url` (…/retrieve) and returns the "result" lists, `max_queries` queries per request
  (the server's default cap). An HTTP error raises RetrievalHTTPError with the status and the server's
  message; a connection the server drops while the body is being sent raises it with status None."""
  queries = list(queries)
  if len(queries) > max_queries:
    return [row for start in range(0, len(queries), max_queries)
            for row in retrieve_http(url, queries[start:start + max_queries], topk, return_scores, timeout,
                                     max_queries)]
  body = json.dumps({"queries": queries, "topk": topk, "return_scores": return_scores}).encode()
  request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=timeout) as response:
      return json.loads(response.read())["result"]
  except urllib.error.HTTPError as e:
    raise RetrievalHTTPError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')}", e.code) from None
  except (urllib.error.URLError, ConnectionError) as e:
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(reason, (BrokenPipeError, ConnectionResetError)):
      raise RetrievalHTTPError(f"{url}: the server closed the connection on a request of {len(body)} bytes "
                               f"({reason}); the body may exceed its --max-body-mb") from None
    raise


KINDS = ("vector", "bm25", "hybrid")  # retrieval.engine.KINDS, spelt out so --help needs no heavy imports


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="python -m retrieval.server", formatter_class=argparse.RawDescriptionHelpFormatter,
      description=__doc__.split("\n", 1)[1],
      epilog="example: python -m retrieval.server --corpus kb.jsonl --kind bm25 --port 8000\n"
             "  curl -s localhost:8000/retrieve -d '{\"queries\": [\"who wrote Hamlet\"], \"topk\": 3, "
             "\"return_scores\": true}'")
  p.add_argument("--corpus", required=True, help="JSON lines: {id, text, title?} or {id, contents}")
  p.add_argument("--index", default="", help="a prebuilt FAISS index of the corpus (Search-R1's e5_Flat.index "
                 "layout, retrieval.build_index): served as is, nothing re-embedded (retrieval.prebuilt)")
  p.add_argument("--query-prefix", default=None, help="with --index: text before each query (default: as built, "
                 "else by embedder name: e5 'query: ')")
  p.add_argument("--kind", default="hybrid", choices=KINDS, help="retriever (default hybrid = BM25 + dense RRF)")
  p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 = all)")
  p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = a free one)")
  p.add_argument("--embedder", default="", help="model folder or alias (vector/hybrid; default all-MiniLM-L6-v2; "
                 "with --index: the one it was built with)")
  p.add_argument("--topk", type=int, default=3, help="results per query when a request sends no topk (3)")
  p.add_argument("--max-topk", type=int, default=1000, help="cap on a request's topk (1000)")
  p.add_argument("--workers", type=int, default=4, help="threads running searches at once (4)")
  p.add_argument("--max-queries", type=int, default=MAX_QUERIES,
                 help=f"queries per request; more get 413 ({MAX_QUERIES})")
  p.add_argument("--batch-queries", type=int, default=BATCH_QUERIES,
                 help=f"queries per engine call; a big request yields its worker between batches ({BATCH_QUERIES})")
  p.add_argument("--max-connections", type=int, default=1000, help="open connections beyond which requests get 503")
  p.add_argument("--keep-alive-timeout", type=float, default=5.0, help="close idle keep-alive connections after s (5)")
  p.add_argument("--idle-timeout", type=float, default=10.0,
                 help="close connections silent for s before/within a request (10)")
  p.add_argument("--max-body-mb", type=float, default=MAX_BODY_BYTES / 2**20, help="413 above this body size (8)")
  p.add_argument("--verbose", action="store_true", help="access log, and tracebacks for errors")
  return p


def main(argv: list[str] | None = None) -> None:
  args = _parser().parse_args(argv)
  for name in ("topk", "max_topk", "workers", "max_connections", "max_queries", "batch_queries"):
    if getattr(args, name) < 1:
      _parser().error(f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= 1")
  from fineflax.extras import MissingExtra, require, search_engine_modules
  try:  # a missing package of the [retrieval] extra, then a busy port: one line before the (slow) index build
    require("python -m retrieval.server --index" if args.index else f"python -m retrieval.server --kind {args.kind}",
            ("faiss",) if args.index else search_engine_modules(args.kind, args.embedder))
  except MissingExtra as e:
    print(f"retrieval.server: error: {e}", file=sys.stderr)
    sys.exit(2)
  try:
    sock = bind_socket(args.host, args.port)
    if args.index:
      from retrieval.prebuilt import load_prebuilt
      engine = load_prebuilt(args.index, args.corpus, embedder=args.embedder, query_prefix=args.query_prefix)
    else:
      from retrieval.documents import read_jsonl
      documents = read_jsonl(args.corpus)  # corpus mistakes surface before the slow imports and index build
      from retrieval.engine import create_search_engine
      engine = create_search_engine(args.kind, documents, embedder=args.embedder or "all-MiniLM-L6-v2")
  except (OSError, ValueError, TypeError, KeyError) as e:
    if args.verbose:
      raise
    message = e.args[0] if isinstance(e, KeyError) and e.args else e
    print(f"retrieval.server: error: {message}", file=sys.stderr)
    sys.exit(2)
  server = RetrievalServer(engine, args.host, sock=sock, workers=args.workers, default_topk=args.topk,
                           max_topk=args.max_topk, max_connections=args.max_connections,
                           max_queries=args.max_queries, batch_queries=args.batch_queries,
                           keep_alive_timeout=args.keep_alive_timeout, idle_timeout=args.idle_timeout,
                           max_body_bytes=int(args.max_body_mb * 2**20), verbose=args.verbose)
  print(f"serving {len(engine)} documents ({'prebuilt ' + args.index if args.index else args.kind}) on {server.url}",
        file=sys.stderr, flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()


if __name__ == "__main__":
  main()
