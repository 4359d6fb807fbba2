"""BM25 lexical index on bm25s (Lù 2024), with string ids, stop words, stemming and save/load.

score(q, d) = sum_{t in q} idf(t) * tf(t, d) / (tf(t, d) + k1 (1 - b + b |d| / avgdl))     (+ variants)
  "lucene"    idf = log(1 + (N - df + 0.5) / (df + 0.5))                                   (default)
  "robertson" idf = log((N - df + 0.5) / (df + 0.5)), floored at 0 (bm25s; rank-bm25's BM25Okapi instead
              floors it at eps * mean idf). Note the tf part lacks Okapi's (k1 + 1) factor, as in Lucene:
              rank-bm25 Okapi scores = (k1 + 1) * these, wherever all query idfs are positive.
  "bm25l", "bm25+" with `delta` (Lv & Zhai 2011).
Tokens: lower-cased words of >= 2 word characters, optional stop words (bm25s' English list), optional
PyStemmer stemming. bm25s indexes are static: `index` (re)builds from scratch.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Sequence

import bm25s
import numpy as np

from retrieval.atomic import atomic_dir, read_meta

METHODS = ("lucene", "robertson", "bm25l", "bm25+", "atire")
_FORMAT = 1


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
  """Indices of the k largest scores, best first; among equal scores the lower index first."""
  n = len(scores)
  if k >= n:
    idx = np.arange(n)
  else:
    threshold = np.partition(scores, n - k)[n - k]
    above = np.flatnonzero(scores > threshold)
    idx = np.concatenate([above, np.flatnonzero(scores == threshold)[:k - len(above)]])
  return idx[np.lexsort((idx, -scores[idx]))]


class BM25Index:
  """A static BM25 index over (string id, text) pairs."""

  def __init__(self, method: str = "lucene", k1: float = 1.5, b: float = 0.75, delta: float = 0.5,
               stopwords: str | None = "en", stemmer: str | None = "english"):
    if method not in METHODS:
      raise ValueError(f"method={method!r}: choose one of {METHODS}")
    if k1 < 0 or not 0 <= b <= 1:
      raise ValueError(f"k1={k1}, b={b}: need k1 >= 0 and 0 <= b <= 1")
    self.config = dict(method=method, k1=k1, b=b, delta=delta, stopwords=stopwords, stemmer=stemmer)
    self._stemmer = None
    if stemmer:
      import Stemmer
      self._stemmer = Stemmer.Stemmer(stemmer)
    self._model: bm25s.BM25 | None = None
    self.ids: list[str] = []
    self._split = re.compile(r"(?u)\b\w\w+\b").findall  # bm25s.tokenize's default token_pattern
    self._stop = frozenset(bm25s.tokenization._infer_stopwords(stopwords or []))

  def tokenize(self, texts: Sequence[str]) -> list[list[str]]:
    """The tokens BM25 sees for each text (lower-cased, stop words removed, stemmed)."""
    return bm25s.tokenize(list(texts), stopwords=self.config["stopwords"] or [], stemmer=self._stemmer,
                          return_ids=False, show_progress=False)

  def _query_tokens(self, text: str) -> list[str]:
    """tokenize([text])[0] without bm25s' per-call overhead (progress bars, vocabulary building)."""
    tokens = [t for t in self._split(text.lower()) if t not in self._stop]
    return self._stemmer.stemWords(tokens) if self._stemmer is not None and tokens else tokens

  def index(self, ids: Sequence[str], texts: Sequence[str]) -> None:
    """Builds the index from scratch; ids must be unique strings aligned with texts."""
    ids, texts = list(ids), list(texts)
    if len(ids) != len(texts):
      raise ValueError(f"{len(ids)} ids but {len(texts)} texts")
    if len(set(ids)) != len(ids):
      raise ValueError(f"duplicate id {next(i for i in ids if ids.count(i) > 1)!r}")
    c = self.config
    model = bm25s.BM25(method=c["method"], k1=c["k1"], b=c["b"], delta=c["delta"])
    if ids:
      model.index(self.tokenize(texts), show_progress=False)
    self._model, self.ids = model, ids

  def __len__(self) -> int:
    return len(self.ids)

  def get_scores(self, query: str) -> np.ndarray:
    """float32 [N]: the BM25 score of every indexed document for one query."""
    self._require_index()
    ids = self._model.get_tokens_ids(self._query_tokens(query))
    if not ids:
      return np.zeros(len(self.ids), np.float32)
    return self._model.get_scores_from_ids(ids)

  def search(self, queries: Sequence[str], k: int, n_threads: int = 0) -> list[list[tuple[str, float]]]:
    """Per query, up to k (id, score) with score > 0, best first (ties: lower index first, as bm25s' JAX
    top-k). n_threads > 0 uses bm25s' multiprocess retrieve; 0 scores each query in this thread."""
    if isinstance(queries, str):
      raise TypeError("queries must be a sequence of strings, not one string")
    if k < 1:
      raise ValueError(f"k={k}: must be >= 1")
    self._require_index()
    k = min(k, len(self.ids))
    if not queries or k == 0:
      return [[] for _ in queries]
    if n_threads:
      tokens = [[t for t in q if t in self._model.vocab_dict] for q in self.tokenize(queries)]
      docs, scores = self._model.retrieve(tokens, k=k, show_progress=False, n_threads=n_threads)
      return [[(self.ids[d], float(s)) for d, s in zip(drow, srow) if s > 0]
              for drow, srow in zip(docs, scores)]
    out = []
    for q in queries:
      ids = self._model.get_tokens_ids(self._query_tokens(q))
      if not ids:
        out.append([])
        continue
      scores = self._model.get_scores_from_ids(ids)
      out.append([(self.ids[d], float(scores[d])) for d in top_k(scores, k) if scores[d] > 0])
    return out

  def _require_index(self) -> None:
    if self._model is None:
      raise RuntimeError("BM25Index is empty: call index(ids, texts) first")

  def save(self, path: str | os.PathLike) -> None:
    """Writes folder `path` (bm25s files + meta.json) via a temporary folder and os.replace."""
    self._require_index()
    with atomic_dir(path) as tmp:
      if self.ids:
        self._model.save(str(tmp / "bm25s"))
      (tmp / "meta.json").write_text(json.dumps(dict(format=_FORMAT, config=self.config, ids=self.ids)))

  @classmethod
  def load(cls, path: str | os.PathLike) -> "BM25Index":
    path = pathlib.Path(path)
    meta = read_meta(path, _FORMAT, "BM25Index")
    self = cls(**meta["config"])
    self.ids = list(meta["ids"])
    c = self.config
    self._model = (bm25s.BM25.load(str(path / "bm25s")) if self.ids else
                   bm25s.BM25(method=c["method"], k1=c["k1"], b=c["b"], delta=c["delta"]))
    return self
