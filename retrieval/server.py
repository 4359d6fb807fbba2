"""HTTP retrieval server speaking Search-R1's schema, on the standard library.

POST /retrieve {"queries": [str, ...], "topk": 3, "return_scores": true}
  -> {"result": [[{"document": {"id", "contents": "\"Title\"\\ntext"}, "score": s}, ...], ...]}
  (with return_scores false, each inner list holds the documents alone). GET /health -> {"status", "documents"}.
Errors: 400 {"error": msg} for malformed JSON or fields, 404 unknown path, 413 oversized body.
topk is capped at the corpus size (and at `max_topk`). Requests run on a bounded thread pool.

  python -m retrieval.server --corpus FILE.jsonl --kind hybrid --port 8000 [--host 127.0.0.1]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import http.server
import json
import sys
import urllib.request
from typing import Any, Sequence

from retrieval.documents import Hit, read_jsonl
from retrieval.engine import KINDS, SearchEngine, create_search_engine

MAX_BODY_BYTES = 8 << 20


class BadRequest(ValueError):
  pass


def search_r1_document(h: Hit) -> dict[str, Any]:
  return {"id": h.id, "contents": f'"{h.title}"\n{h.text}'}


def parse_request(body: bytes) -> tuple[list[str], int, bool]:
  """Validates a /retrieve body; BadRequest names the field at fault."""
  try:
    payload = json.loads(body)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise BadRequest(f"malformed JSON body: {e}") from None
  if not isinstance(payload, dict):
    raise BadRequest(f"body must be a JSON object, got {type(payload).__name__}")
  queries = payload.get("queries")
  if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
    raise BadRequest("field 'queries' must be a list of strings")
  topk = payload.get("topk", 3)
  if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
    raise BadRequest(f"field 'topk' must be an integer >= 1, got {topk!r}")
  return_scores = payload.get("return_scores", False)
  if not isinstance(return_scores, bool):
    raise BadRequest(f"field 'return_scores' must be a boolean, got {return_scores!r}")
  return queries, topk, return_scores


class _Handler(http.server.BaseHTTPRequestHandler):
  server: "RetrievalServer"
  protocol_version = "HTTP/1.1"

  def _send(self, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def do_GET(self):
    if self.path.rstrip("/") == "/health":
      self._send(200, {"status": "ok", "documents": len(self.server.engine)})
    else:
      self._send(404, {"error": f"unknown path {self.path!r}; use POST /retrieve"})

  def do_POST(self):
    if self.path.rstrip("/") != "/retrieve":
      self._send(404, {"error": f"unknown path {self.path!r}; use POST /retrieve"})
      return
    try:
      length = int(self.headers.get("Content-Length", "0"))
    except ValueError:
      length = -1
    if length < 0 or length > MAX_BODY_BYTES:
      self.close_connection = True
      self._send(413 if length > 0 else 400, {"error": f"Content-Length {length} outside [0, {MAX_BODY_BYTES}]"})
      return
    try:
      queries, topk, return_scores = parse_request(self.rfile.read(length))
    except BadRequest as e:
      self._send(400, {"error": str(e)})
      return
    try:
      hits = self.server.engine.search_batch(queries, min(topk, self.server.max_topk)) if queries else []
    except Exception as e:  # a failing engine must not kill the connection silently
      self._send(500, {"error": f"{type(e).__name__}: {e}"})
      return
    if return_scores:
      result = [[{"document": search_r1_document(h), "score": h.score} for h in row] for row in hits]
    else:
      result = [[search_r1_document(h) for h in row] for row in hits]
    self._send(200, {"result": result})

  def log_message(self, fmt, *args):
    if self.server.verbose:
      super().log_message(fmt, *args)


class RetrievalServer(http.server.HTTPServer):
  """An HTTPServer that handles each connection on a fixed-size thread pool."""

  daemon_threads = True

  def __init__(self, engine: SearchEngine, host: str = "127.0.0.1", port: int = 8000, max_workers: int = 8,
               max_topk: int = 1000, verbose: bool = False):
    self.engine, self.max_topk, self.verbose = engine, max_topk, verbose
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="retrieve")
    super().__init__((host, port), _Handler)

  def process_request(self, request, client_address):
    self._pool.submit(self._handle, request, client_address)

  def _handle(self, request, client_address):
    try:
      self.finish_request(request, client_address)
    except Exception:
      self.handle_error(request, client_address)
    finally:
      self.shutdown_request(request)

  def server_close(self):
    super().server_close()
    self._pool.shutdown(wait=True)


def retrieve_http(url: str, queries: Sequence[str], topk: int = 3, return_scores: bool = True,
                  timeout: float = 60.0) -> list[list[dict]]:
  """Client: POSTs to `url` (…/retrieve) and returns the "result" lists; HTTP errors raise with the message."""
  body = json.dumps({"queries": list(queries), "topk": topk, "return_scores": return_scores}).encode()
  request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=timeout) as response:
      return json.loads(response.read())["result"]
  except urllib.error.HTTPError as e:
    raise RuntimeError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')}") from None


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--corpus", required=True, help="JSON lines: {id, text, title?} or {id, contents}")
  p.add_argument("--kind", default="hybrid", choices=KINDS)
  p.add_argument("--host", default="127.0.0.1")
  p.add_argument("--port", type=int, default=8000)
  p.add_argument("--embedder", default="all-MiniLM-L6-v2", help="model folder or alias")
  p.add_argument("--workers", type=int, default=8)
  p.add_argument("--verbose", action="store_true")
  args = p.parse_args(argv)
  engine = create_search_engine(args.kind, read_jsonl(args.corpus), embedder=args.embedder)
  server = RetrievalServer(engine, args.host, args.port, max_workers=args.workers, verbose=args.verbose)
  print(f"serving {len(engine)} documents ({args.kind}) on http://{args.host}:{server.server_port}/retrieve",
        file=sys.stderr, flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()


if __name__ == "__main__":
  main()
