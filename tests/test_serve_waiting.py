"""serve.waiting.WaitQueue: the bound counts rows beyond the free slots, an empty queue always takes a job, the
deadline expires the oldest first, and the waits give the quantiles and Retry-After (a fake clock)."""
import math

import numpy as np
import pytest

from fineflax.serve.waiting import QueueFull, WaitQueue

pytestmark = pytest.mark.fast


class Clock:
  t = 0.0

  def __call__(self):
    return self.t


def test_the_bound_counts_rows_past_the_free_slots_and_refusals_are_counted_once():
  q = WaitQueue(max_rows=4)
  q.enter("a", 8)  # an empty queue takes a job of any size (n > max_rows runs alone)
  with pytest.raises(QueueFull, match="8 rows wait"):
    q.enter("b", 1)
  q.enter("b", 3, room=7)  # 8 + 3 <= 4 + 7 free slots
  with pytest.raises(QueueFull):
    q.enter("c", 1, room=7, final=False)  # a retry may follow: not counted
  assert q.rows == 11 and q.stats["rejected_full"] == 1
  q.left("a")
  q.enter("c", 1)
  assert q.jobs() == ["b", "c"] and q.rows == 4
  with pytest.raises(ValueError, match="max_waiting=0"):
    WaitQueue(max_rows=0)
  with pytest.raises(ValueError, match="queue_timeout=0"):
    WaitQueue(timeout_s=0)


def test_deadline_waits_quantiles_and_retry_after():
  clock = Clock()
  q = WaitQueue(timeout_s=2.0, clock=clock)
  assert math.isnan(q.wait_quantiles()[0.5]) and q.retry_after() == 1
  waits = [0.5, 1.0, 1.5, 3.5]
  for i, w in enumerate(waits):
    q.enter(i, 1)
    clock.t += w
    assert q.admitted(i) == pytest.approx(w)
  assert q.admitted(0) is None  # admitted once
  assert q.wait_quantiles()[0.9] == pytest.approx(np.quantile(waits, 0.9))
  assert q.retry_after() == math.ceil(np.median(waits)) == 2
  q.enter("old", 1)
  clock.t += 1.5
  q.enter("new", 1)
  clock.t += 1.0  # old waited 2.5 s, new 1 s
  assert q.expired() == ["old"] and q.jobs() == ["new"] and q.stats["expired"] == 1
  assert q.stats["wait_s_sum"] == pytest.approx(sum(waits)) and q.stats["admitted"] == 4
