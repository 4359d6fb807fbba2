"""RRF and convex combination against hand-computed values."""
import pytest

from retrieval.fusion import convex_combination, rrf

pytestmark = pytest.mark.fast


def test_rrf_hand_made():
  dense = ["a", "b", "c"]
  lexical = [("c", 9.0), ("a", 5.0), ("d", 1.0)]
  fused = dict(rrf([dense, lexical], weights=[1.0, 2.0], k=60))
  assert fused["a"] == pytest.approx(1 / 61 + 2 / 62)
  assert fused["b"] == pytest.approx(1 / 62)
  assert fused["c"] == pytest.approx(1 / 63 + 2 / 61)
  assert fused["d"] == pytest.approx(2 / 63)
  order = [d for d, _ in rrf([dense, lexical], weights=[1.0, 2.0], k=60)]
  assert order == ["c", "a", "d", "b"]


def test_rrf_window_and_errors():
  fused = dict(rrf([["a", "b", "c"], ["c"]], k=0, window=2))
  assert fused == {"a": 1.0, "b": 0.5, "c": 1.0}  # c at rank 3 is outside the first window
  with pytest.raises(ValueError, match="2 weights for 1 rankings"):
    rrf([["a"]], weights=[1, 2])


def test_convex_combination():
  fused = dict(convex_combination([[("a", 3.0), ("b", 2.0), ("c", 1.0)], [("b", 10.0), ("d", 0.0)]],
                                  weights=[0.3, 0.7]))
  assert fused == pytest.approx({"a": 0.3, "b": 0.3 * 0.5 + 0.7, "c": 0.0, "d": 0.0})
  assert dict(convex_combination([[("x", 2.0), ("y", 2.0)]])) == {"x": 1.0, "y": 1.0}
