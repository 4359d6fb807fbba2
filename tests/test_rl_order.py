"""Training orders (fineflax.rl.order): wrapping is idempotent, and an order less the retired questions."""
import signal

import numpy as np
import pytest

from fineflax.rl.order import AliveOrder, CycleOrder, EpochOrder, StreamOrder, as_order

pytestmark = pytest.mark.fast


@pytest.fixture(autouse=True)
def _five_seconds():
  """Iterating an order never ends (every position maps): a regression hangs, so the test is cut at 5 s."""
  def fail(*_):
    raise TimeoutError("as_order did not return in 5 s")
  old = signal.signal(signal.SIGALRM, fail)
  signal.alarm(5)
  yield
  signal.alarm(0)
  signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("order", [EpochOrder(5, 0), StreamOrder(5), CycleOrder([4, 2, 0]),
                                   AliveOrder(EpochOrder(5, 0), lambda q: q != 3)])
def test_an_order_is_taken_as_it_is(order):
  assert as_order(order) is order and as_order(as_order(order)) is order


def test_a_sequence_is_read_cyclically_and_retired_questions_leave_it():
  order = as_order(np.array([3, 1, 2, 0]))
  assert isinstance(order, CycleOrder) and [order[k] for k in range(6)] == [3, 1, 2, 0, 3, 1]
  alive = AliveOrder(order, lambda q: q not in (1, 2))
  assert [alive[k] for k in range(5)] == [3, 0, 3, 0, 3] and len(alive) == 2
  assert [AliveOrder(order, lambda q: False)[k] for k in range(4)] == [3, 1, 2, 0]  # all retired: the order
