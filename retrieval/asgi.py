"""HTTP serving pieces shared by the retrieval server and the chat server (`fineflax.serve`).

idle_timeout_protocol(s)   uvicorn's HTTP protocol that closes a connection whose client sent no byte for
                           s seconds while the server waits on it (before or between requests, or
                           mid-body); uvicorn alone only times out keep-alive connections after a
                           completed response, so a silent or half-open connection would stay forever.
                           The base is httptools' protocol when `httptools` is installed (the
                           [retrieval] extra), else h11's (a uvicorn dependency): the chat server runs
                           after the main install alone.
read_capped_body(request, limit, drain_cap)
                           (body or None, size): the body if it is at most `limit` bytes; otherwise the
                           rest is read and dropped (up to `drain_cap` bytes) so that the 413 answer
                           reaches a client that is still sending, even one that asked for
                           `Connection: close` (urllib) and would otherwise see a reset.
parse_json(data)           the parsed body; ValueError with a one-line reason for malformed JSON, bad
                           UTF-8 or nesting too deep for the parser (a RecursionError otherwise).
"""
from __future__ import annotations

import json
from typing import Any

DRAIN_CAP = 64 << 20  # an over-limit body is read (and dropped) up to this size before the answer is sent


def parse_json(data: bytes) -> Any:
  try:
    return json.loads(data)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"malformed JSON body: {e}") from None
  except RecursionError:
    raise ValueError("malformed JSON body: nested too deeply") from None


async def read_capped_body(request, limit: int, drain_cap: int = DRAIN_CAP) -> tuple[bytes | None, int]:
  """(body, size) for a body of at most `limit` bytes, else (None, size read so far); see module doc.
  A declared Content-Length above `drain_cap` is answered at once (size = the declared length)."""
  declared = request.headers.get("content-length", "")
  if declared.isdigit() and int(declared) > drain_cap:
    return None, int(declared)
  parts, size = [], 0
  async for part in request.stream():  # Content-Length or chunked transfer encoding
    size += len(part)
    if size <= limit:
      parts.append(part)
    elif size > drain_cap:
      break
  return (b"".join(parts), size) if size <= limit else (None, size)


def http_protocol_base() -> type:
  """uvicorn's httptools protocol class if `httptools` imports, else its h11 one (uvicorn's own "auto" rule).
  Both keep the state `idle_timeout_protocol` reads: `cycle` (None before the first request) with
  `response_complete` and `more_body`, `loop` and `transport`."""
  try:
    import httptools  # noqa: F401
  except ImportError:
    from uvicorn.protocols.http.h11_impl import H11Protocol
    return H11Protocol
  from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
  return HttpToolsProtocol


def idle_timeout_protocol(idle_timeout: float):
  """A uvicorn protocol class (`http_protocol_base()`) closing connections silent for `idle_timeout` s."""

  class TimedProtocol(http_protocol_base()):
    def connection_made(self, transport):
      super().connection_made(transport)
      self._last_data = self.loop.time()
      self._watch = self.loop.call_later(idle_timeout, self._check_idle)

    def data_received(self, data: bytes) -> None:
      self._last_data = self.loop.time()
      super().data_received(data)

    def on_response_complete(self) -> None:
      self._last_data = self.loop.time()  # the wait on the client starts now, not at its last byte (a
      super().on_response_complete()      # response slower than idle_timeout closed the connection at once)

    def connection_lost(self, exc):
      if self._watch is not None:
        self._watch.cancel()
        self._watch = None
      super().connection_lost(exc)

    def _check_idle(self) -> None:
      self._watch = None
      if self.transport.is_closing():
        return
      cycle = self.cycle
      waiting_on_client = cycle is None or cycle.response_complete or cycle.more_body
      idle = self.loop.time() - self._last_data
      if waiting_on_client and idle >= idle_timeout:
        self.transport.close()
        return
      self._watch = self.loop.call_later(max(idle_timeout - idle, 0.05) if waiting_on_client else idle_timeout,
                                         self._check_idle)

  return TimedProtocol
