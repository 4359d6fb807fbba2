"""The derived cross-mesh tolerances (fineflax/testing/tolerance.py) hold against real arithmetic: two summation
orders of float32 terms, and optax's AdamW step from gradients that differ by a known amount."""
import numpy as np
import optax
import pytest

from fineflax.testing.tolerance import U32, adamw_first_step_tol, sum_order_tol


@pytest.mark.fast
def test_two_summation_orders_differ_by_less_than_the_bound():
  rng = np.random.default_rng(0)
  for n in (16, 256, 4096):
    x = rng.standard_normal((200, n)).astype(np.float32) / n  # gradient-like terms of a mean
    sequential = np.zeros(200, np.float32)
    for i in range(n):
      sequential = (sequential + x[:, i]).astype(np.float32)
    tree = x.reshape(200, 4, -1).sum(-1, dtype=np.float32).sum(-1, dtype=np.float32)  # 4 devices, then all-reduce
    err = np.abs(sequential.astype(np.float64) - tree)
    assert (err <= sum_order_tol(n, np.abs(x).astype(np.float64).sum(-1), ulps=2.0)).all()  # Higham's bound
    assert err.max() > 0  # the orders do differ
  with pytest.raises(ValueError, match="n=0"):
    sum_order_tol(0, 1.0)


@pytest.mark.fast
def test_adamw_first_step_moves_within_the_bound_for_gradients_that_differ_by_delta():
  rng = np.random.default_rng(1)
  lr, eps = 1e-2, 1e-6
  g = (rng.standard_normal(10_000) * np.logspace(-8, -2, 10_000)).astype(np.float32)  # many near eps
  delta = np.float32(3e-8)
  g2 = (g + delta * rng.uniform(-1, 1, g.shape)).astype(np.float32)
  p = rng.standard_normal(g.shape).astype(np.float32) * 0.02
  opt = optax.adamw(lr, eps=eps, weight_decay=0.1)
  step = lambda grad: np.asarray(optax.apply_updates(p, opt.update(grad, opt.init(p), p)[0]))
  err = np.abs(step(g).astype(np.float64) - step(g2))
  tol = adamw_first_step_tol(g, delta, p, lr, eps)
  assert (err <= tol).all()
  assert err.max() > 0.2 * tol.max()  # not vacuous: near g = 0 the bound is nearly reached
  assert tol.max() <= 2 * lr + 4 * U32 * (np.abs(p).max() + lr)
