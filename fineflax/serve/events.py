"""How a request's handler hears of its job: engine events through a `LoopOutbox`, the client leaving
(`post_on_disconnect`), and an error event as an HTTP error (`event_error`)."""
from __future__ import annotations

import asyncio
import threading

from starlette.requests import Request

from fineflax.serve import protocol as P


async def post_on_disconnect(request: Request, queue: asyncio.Queue) -> None:
  """Puts ("disconnect",) on `queue` when the ASGI server reports the client gone (`http.disconnect`; after
  the body was read, `receive` waits for exactly that)."""
  while (await request.receive())["type"] != "http.disconnect":
    pass
  queue.put_nowait(("disconnect",))


def event_error(ev) -> P.ApiError:
  """The ApiError of an ("error", message[, status, retry_after]) event (`serve.engine.Job`): 500 unless
  it names a status (429 / 503: code "server_overloaded"); a Retry-After header when it gives one."""
  status = ev[2] if len(ev) > 2 else 500
  headers = {"Retry-After": str(ev[3])} if len(ev) > 3 else None
  return P.ApiError(status, ev[1], code="server_overloaded" if status in (429, 503) else None, headers=headers)


class LoopOutbox:
  """Events posted from the engine thread to asyncio queues of one event loop, delivered in batches: one
  `call_soon_threadsafe` (one wake-up of the loop) for all the events posted before the loop drains them,
  instead of one per event (a decode chunk of 128 streams posts 128 deltas at once)."""

  def __init__(self, loop: asyncio.AbstractEventLoop):
    self.loop, self._items, self._lock, self._scheduled = loop, [], threading.Lock(), False

  def post(self, queue: asyncio.Queue, event) -> None:
    with self._lock:
      self._items.append((queue, event))
      if self._scheduled:
        return
      self._scheduled = True
    self.loop.call_soon_threadsafe(self._drain)

  def _drain(self) -> None:
    with self._lock:
      items, self._items, self._scheduled = self._items, [], False
    for queue, event in items:
      queue.put_nowait(event)
