"""serve.logwriter.LogWriter: answers ending together are written in one transaction each batch, every row
once and in order, each request resumed only after its rows are committed; a failed write fails its batch."""
import asyncio
import threading
import time

import pytest

from fineflax.serve.logwriter import LogWriter

pytestmark = pytest.mark.fast


class SlowLog:
  """A log whose commit takes 20 ms; with `hold_until`, the first commit waits (up to 30 s) until its own rows'
  requests (2 rows each) and those queued behind it number that many, so how a burst is batched does not
  depend on the machine's load."""
  def __init__(self, fail=False, hold_until=None):
    self.calls, self.fail, self.committed = [], fail, set()
    self.writer, self.hold_until = None, hold_until

  def add_responses(self, rows):
    if self.hold_until is not None and not self.calls:
      deadline = time.monotonic() + 30
      while len(rows) // 2 + len(self.writer._pending) < self.hold_until and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.02)  # a commit
    if self.fail:
      raise OSError("disk full")
    self.calls.append([r["id"] for r in rows])
    self.committed.update(r["id"] for r in rows)


def test_a_burst_is_written_in_a_few_transactions_and_each_waits_for_its_commit():
  log = SlowLog(hold_until=64)  # the first commit runs while the rest of the burst arrives
  writer = LogWriter(log)
  log.writer = writer

  async def request(i):
    await writer.add([{"id": f"{i}/0"}, {"id": f"{i}/1"}])
    return {f"{i}/0", f"{i}/1"} <= log.committed  # committed before the request went on

  async def burst():
    return await asyncio.gather(*[request(i) for i in range(64)])
  assert all(asyncio.run(burst()))
  writer.close()
  rows = [r for call in log.calls for r in call]
  assert sorted(rows) == sorted(f"{i}/{j}" for i in range(64) for j in range(2))
  assert all(rows.index(f"{i}/0") + 1 == rows.index(f"{i}/1") for i in range(64))  # a request's rows together
  assert writer.batches == len(log.calls) <= 2  # the first batch, then all the rest (before: 64, one each)
  assert not writer._thread.is_alive()  # close() ended this writer's thread (other tests' servers may run their own)


def test_a_failed_write_fails_every_request_of_its_batch():
  writer = LogWriter(SlowLog(fail=True))

  async def burst():
    return await asyncio.gather(*[writer.add([{"id": str(i)}]) for i in range(5)], return_exceptions=True)
  errors = asyncio.run(burst())
  writer.close()
  assert all(isinstance(e, OSError) and "disk full" in str(e) for e in errors)
