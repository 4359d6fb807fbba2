"""Feature-hashing bag-of-words embeddings: a deterministic, model-free embedding function.

e(text) = normalize(sum over lowercase word tokens w of sign(w) * onehot(h(w) mod dim)), with h and sign
taken from blake2b of the token. Texts sharing words get positive cosine similarity; no model needed,
so it serves tests and offline stores. An empty text maps to a fixed unit vector.
"""
from __future__ import annotations

import hashlib
import re

import numpy as np

_TOKEN = re.compile(r"[A-Za-z0-9_]+")


def hashed_bow(texts: list[str], dim: int = 256) -> np.ndarray:
  """float32 [len(texts), dim], rows L2-normalised."""
  out = np.zeros((len(texts), dim), np.float32)
  for i, text in enumerate(texts):
    for token in _TOKEN.findall(text.lower()):
      digest = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little")
      out[i, digest % dim] += 1.0 if (digest >> 63) else -1.0
    if not out[i].any():
      out[i, 0] = 1.0
  return out / np.linalg.norm(out, axis=1, keepdims=True)


class HashingEmbedding:
  """Callable texts -> hashed_bow(texts, dim); counts calls and texts (handy to assert no re-embedding)."""

  def __init__(self, dim: int = 256):
    self.dim, self.calls, self.texts = dim, 0, 0

  def __call__(self, texts: list[str]) -> np.ndarray:
    self.calls += 1
    self.texts += len(texts)
    return hashed_bow(list(texts), self.dim)
