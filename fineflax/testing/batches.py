"""Random model inputs for tests and benchmarks."""
from __future__ import annotations

import numpy as np


def random_sft_batch(rng: np.random.RandomState, shape: tuple[int, ...], vocab: int) -> dict[str, np.ndarray]:
  """An SFT batch of `shape` ([B, T], or [A, B, T] micro-batches): random tokens and targets, about 70% of
  the targets in the loss, no padding, one segment a row (the fields of `fineflax.train.sft_step`)."""
  t = shape[-1]
  return {"tokens": rng.randint(0, vocab, shape).astype(np.int32),
          "targets": rng.randint(0, vocab, shape).astype(np.int32),
          "loss_mask": (rng.rand(*shape) > 0.3).astype(np.float32),
          "attention_mask": np.ones(shape, np.int32),
          "positions": np.broadcast_to(np.arange(t, dtype=np.int32), shape).copy(),
          "segment_ids": np.ones(shape, np.int32)}
