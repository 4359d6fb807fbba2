"""Tolerances of cross-mesh parity tests, derived from the arithmetic instead of tuned by trial.

A sharded computation sums in another order than one device: each partial sum is formed on its device and
the partials are then added (all-reduce). Two orders of a sum of n float terms differ by at most
2·(n-1)·u·Σ|x_i| (Higham, "Accuracy and Stability of Numerical Algorithms", (4.4): (n-1)·u·Σ|x_i| for each
order; u the dtype's unit roundoff, 2^-24 for float32). sum_order_tol = ulps·n·u·scale with scale = Σ|x_i|
is that bound for ulps >= 2. Where Σ|x_i| is not at hand the tests take scale = the size of the result
(terms without cancellation; for a gradient array its largest entry) and ulps = 4: twice the bound, for the
forward and backward passes, which both reduce over the same tokens.

AdamW's first step (t = 1, bias-corrected m̂ = g, v̂ = g²) moves a parameter by -lr·(g/(|g| + eps) + wd·p).
g/(|g|+eps) has slope eps/(|g|+eps)² ≤ 1/eps, so a gradient known to ±δ moves the parameter by at most
lr·eps·δ/(max(|g|-δ, 0) + eps)² (the slope's largest value on [g-δ, g+δ]), never more than 2·lr; the
update's own f32 rounding adds a few ulps of |p| + lr (`adamw_first_step_tol`).

A log-prob from a forward pass goes through a chain of reductions: per layer the q/k/v projections (hidden),
the attention scores (head_dim) and the weighted sum of values (sequence length), the output projection
(heads·head_dim), the MLP's gate/up (hidden) and down (intermediate) projections; then the LM head
(hidden) and the log-sum-exp over the vocabulary. A mesh may reorder any of them (split contractions are
summed across devices). `decoder_path_length` adds up those lengths along one log-prob's path and
`logprob_tol` = sum_order_tol(that length, scale) with scale = the array's largest |log-prob|: first
order in u, and it takes the layers to carry a rounding error on without amplifying it (the norms and the
residual stream keep activations O(1)), which is what the tiny test models do; it is not a bound for an
ill-conditioned network.

Checks with more than one optimizer step have no such bound (the second gradient is taken at parameters
that already differ, through the unknown curvature), so the parity tests compare one AdamW step.
"""
from __future__ import annotations

import numpy as np

U32 = float(np.finfo(np.float32).eps) / 2  # float32 unit roundoff, 2^-24


def unit_roundoff(dtype) -> float:
  return float(np.finfo(dtype).eps) / 2


def sum_order_tol(n: int, scale, ulps: float = 4.0, u: float = U32):
  """Largest difference between two summation orders of n terms with Σ|x_i| = `scale` (module doc):
  ulps·n·u·scale (elementwise when scale is an array)."""
  if n < 1:
    raise ValueError(f"n={n}: a reduction has at least one term")
  return ulps * n * u * np.asarray(scale, np.float64)


def adamw_first_step_tol(g, delta, p, lr: float, eps: float, u: float = U32, ulps: float = 4.0):
  """Elementwise bound on |p1 - p1'| after one AdamW step from the same p when the gradients g and g'
  differ by at most `delta` (module doc)."""
  g, delta, p = (np.abs(np.asarray(x, np.float64)) for x in (g, delta, p))
  slope = eps / (np.maximum(g - delta, 0.0) + eps) ** 2
  return np.minimum(lr * slope * delta, 2 * lr) + ulps * u * (p + lr)


def check_first_adamw_step(p0, p_ref, p_other, mu_ref, n_terms: int, lr: float, eps: float, b1: float = 0.9,
                           clip_rel: float = 0.0, what: str = "params") -> float:
  """Asserts that two meshes' parameters after one AdamW step from `p0` (pytrees) agree within
  `adamw_first_step_tol`, the gradient g = mu_ref / (1 - b1) (AdamW's first moment after one step) known to
  δ = sum_order_tol(n_terms, max|g| of its array) + clip_rel·|g| (clip_rel: the relative error of a
  global-norm clip factor, 2·P·u over P parameters, when it acts). Returns the largest difference as a
  fraction of its bound; AssertionError names the array and the worst element."""
  import jax
  worst = [0.0]

  def one(path, p, a, b, mu):
    g = np.asarray(mu, np.float64) / (1 - b1)
    delta = sum_order_tol(n_terms, np.abs(g).max()) + clip_rel * np.abs(g)
    tol = adamw_first_step_tol(g, delta, p, lr, eps)
    err = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    ratio = err / tol
    k = int(np.argmax(ratio))
    assert ratio.flat[k] <= 1.0, (what, jax.tree_util.keystr(path), float(err.flat[k]), float(tol.flat[k]))
    worst[0] = max(worst[0], float(ratio.flat[k]))

  jax.tree_util.tree_map_with_path(one, p0, p_ref, p_other, mu_ref)
  return worst[0]


def decoder_path_length(c, seq_len: int) -> int:
  """Sum of the reduction lengths along one log-prob's path through decoder `c` (a ModelConfig) over
  `seq_len` positions (module doc)."""
  per_layer = (c.hidden_size + c.head_dim + seq_len + c.num_heads * c.head_dim + c.hidden_size
               + c.intermediate_size)
  return c.num_layers * per_layer + c.hidden_size + c.vocab_size


def logprob_tol(c, seq_len: int, logprobs, ulps: float = 4.0, u: float = U32) -> float:
  """Largest difference between two meshes' log-probs (or logits) of decoder `c` over `seq_len` positions:
  sum_order_tol(decoder_path_length(c, seq_len), max|logprobs|) (module doc)."""
  return float(sum_order_tol(decoder_path_length(c, seq_len), np.abs(np.asarray(logprobs, np.float64)).max(),
                             ulps=ulps, u=u))
