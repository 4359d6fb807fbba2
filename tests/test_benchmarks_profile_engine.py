"""benchmarks.profile_engine's kernel-time arithmetic: busy time is the union of kernel intervals."""
import numpy as np
import pytest

from benchmarks.profile_engine import busy_ns

pytestmark = pytest.mark.fast


def _union_by_grid(kernels, step=1.0):
  """Independent reference: mark every unit cell a kernel covers on an integer grid, count the cells."""
  end = int(max(s + d for _, _, s, d in kernels))
  covered = np.zeros(end, bool)
  for _, _, s, d in kernels:
    covered[int(s):int(s + d)] = True
  return covered.sum() * step


def test_busy_is_the_union_of_kernel_intervals():
  rng = np.random.default_rng(0)
  for _ in range(20):
    kernels = [("op", "k", float(s), float(d)) for s, d in zip(rng.integers(0, 200, 30), rng.integers(1, 40, 30))]
    assert busy_ns(kernels) == _union_by_grid(kernels)
  # disjoint kernels add up; a kernel inside another adds nothing; order does not matter
  assert busy_ns([("a", "a", 0.0, 5.0), ("b", "b", 10.0, 5.0)]) == 10.0
  assert busy_ns([("b", "b", 2.0, 1.0), ("a", "a", 0.0, 5.0)]) == 5.0
  assert busy_ns([]) == 0.0
