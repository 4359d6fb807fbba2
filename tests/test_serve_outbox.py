"""serve.events.LoopOutbox: events posted from another thread reach their queues in order, with one wake-up of
the event loop for all the events posted before it drains them."""
import asyncio
import threading

import pytest

from fineflax.serve.events import LoopOutbox

pytestmark = pytest.mark.fast


def test_events_arrive_in_order_with_one_wakeup_per_batch():
  loop = asyncio.new_event_loop()
  wakeups, call = [], loop.call_soon_threadsafe
  loop.call_soon_threadsafe = lambda *a: (wakeups.append(a), call(*a))[1]

  async def main():
    queues, box = [asyncio.Queue(), asyncio.Queue()], LoopOutbox(asyncio.get_running_loop())
    post = lambda lo, hi: [box.post(queues[i % 2], i) for i in range(lo, hi)]
    for lo, hi in ((0, 300), (300, 301)):  # a batch while the loop is busy, then one more event
      engine = threading.Thread(target=post, args=(lo, hi))
      engine.start()
      engine.join()  # the loop is blocked meanwhile: nothing drains until it awaits
      got = [[await q.get() for _ in range(sum(1 for i in range(lo, hi) if i % 2 == k))] for k, q in enumerate(queues)]
      assert got == [[i for i in range(lo, hi) if i % 2 == k] for k in range(2)]
    return len(wakeups)

  try:
    assert loop.run_until_complete(main()) == 2
  finally:
    loop.close()
