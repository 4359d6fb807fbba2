"""Dense vector index on FAISS with string ids: exact inner product by default, IVF / HNSW when large.

score(q, d) = <q, d> (cosine for L2-normalised vectors). Kinds:
  "flat": IndexIDMap2(IndexFlatIP), exact.
  "ivf":  IndexIVFFlat(IP, nlist), int64 ids stored natively; nlist = clip(4 sqrt(n), 1, n // 39)
          chosen at training time, `nprobe` lists visited per query.
  "hnsw": IndexIDMap2(IndexHNSWFlat(IP, M)); FAISS cannot delete from HNSW, so delete/upsert rebuild it.
  "auto": flat until `ivf_threshold` vectors, then rebuilt as IVF (HNSW only when asked for).
String ids map to int64 ids 0, 1, 2, ... (never reused). save/load write a folder atomically.
"""
from __future__ import annotations

import json
import os
import pathlib
from typing import Sequence

from retrieval.atomic import atomic_dir, read_meta
from retrieval.lazy import lazy_import
from retrieval.threads import faiss_threads

faiss = lazy_import("faiss", "faiss-cpu")  # loaded on first use: BM25-only users need no faiss
import numpy as np

KINDS = ("auto", "flat", "ivf", "hnsw")
_FORMAT = 1


class DenseIndex:
  """add / upsert / delete / search over (string id, float32 vector) pairs."""

  def __init__(self, dim: int, kind: str = "auto", *, ivf_threshold: int = 200_000, nlist: int | None = None,
               nprobe: int = 16, hnsw_m: int = 32, ef_construction: int = 80, ef_search: int = 64):
    if kind not in KINDS:
      raise ValueError(f"kind={kind!r}: choose one of {KINDS}")
    if dim < 1:
      raise ValueError(f"dim={dim}: must be >= 1")
    self.dim, self.kind = int(dim), kind
    self.options = dict(ivf_threshold=ivf_threshold, nlist=nlist, nprobe=nprobe, hnsw_m=hnsw_m,
                        ef_construction=ef_construction, ef_search=ef_search)
    self._str_to_int: dict[str, int] = {}
    self._int_to_str: dict[int, str] = {}
    self._next_id = 0
    self.index = self._new_index(self._structure(0), train=None)

  # ---- structure -------------------------------------------------------------------------------
  def _structure(self, n: int) -> str:
    if self.kind != "auto":
      return self.kind
    return "ivf" if n >= self.options["ivf_threshold"] else "flat"

  @property
  def structure(self) -> str:
    """The FAISS structure in use now: "flat", "ivf" or "hnsw"."""
    inner = faiss.downcast_index(self.index.index) if isinstance(self.index, faiss.IndexIDMap2) else self.index
    if isinstance(inner, faiss.IndexHNSW):
      return "hnsw"
    return "ivf" if isinstance(inner, faiss.IndexIVF) else "flat"

  def _new_index(self, structure: str, train: np.ndarray | None):
    o = self.options
    if structure == "flat":
      return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
    if structure == "hnsw":
      inner = faiss.IndexHNSWFlat(self.dim, o["hnsw_m"], faiss.METRIC_INNER_PRODUCT)
      inner.hnsw.efConstruction = o["ef_construction"]
      inner.hnsw.efSearch = o["ef_search"]
      return faiss.IndexIDMap2(inner)
    n = 0 if train is None else len(train)
    nlist = o["nlist"] or int(np.clip(4 * np.sqrt(max(n, 1)), 1, max(1, n // 39)))
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(self.dim), self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.nprobe = min(o["nprobe"], nlist)
    if train is not None and len(train):
      index.train(train)
    index.set_direct_map_type(faiss.DirectMap.Hashtable)
    return index

  def _all(self) -> tuple[np.ndarray, np.ndarray]:
    """(int ids [n], vectors [n, d]) currently stored."""
    ids = np.fromiter(self._int_to_str, np.int64, len(self._int_to_str))
    vecs = np.stack([self.index.reconstruct(int(i)) for i in ids]) if len(ids) else np.zeros((0, self.dim), np.float32)
    return ids, vecs

  def rebuild(self, structure: str | None = None) -> None:
    """Re-creates the FAISS index (retraining IVF) from the stored vectors."""
    ids, vecs = self._all()
    structure = structure or self._structure(len(ids))
    if structure not in KINDS[1:]:
      raise ValueError(f"structure={structure!r}: choose one of {KINDS[1:]}")
    self.index = self._new_index(structure, train=vecs)
    if len(ids):
      self.index.add_with_ids(vecs, ids)

  # ---- mutation --------------------------------------------------------------------------------
  def _check(self, ids: Sequence[str], vectors) -> tuple[list[str], np.ndarray]:
    if isinstance(ids, str):
      raise TypeError("ids must be a sequence of strings, not one string")
    ids = list(ids)
    vectors = np.asarray(vectors, np.float32)
    if not ids and vectors.size == 0:
      vectors = np.zeros((0, self.dim), np.float32)
    if vectors.shape != (len(ids), self.dim):
      raise ValueError(f"vectors shape {vectors.shape} != ({len(ids)}, {self.dim})")
    vectors = np.ascontiguousarray(vectors)
    for i, s in enumerate(ids):
      if not isinstance(s, str):
        raise TypeError(f"ids[{i}] = {s!r} is {type(s).__name__}, expected str")
    if len(set(ids)) != len(ids):
      dup = next(s for s in ids if ids.count(s) > 1)
      raise ValueError(f"duplicate id {dup!r} within one call")
    if not np.isfinite(vectors).all():
      raise ValueError(f"vectors contain NaN or inf (row {int(np.where(~np.isfinite(vectors))[0][0])})")
    return ids, vectors

  def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
    """Adds new ids; raises KeyError if an id is already present (use upsert to replace)."""
    ids, vectors = self._check(ids, vectors)
    present = [s for s in ids if s in self._str_to_int]
    if present:
      raise KeyError(f"id {present[0]!r} already in index ({len(present)} present); use upsert")
    if not ids:
      return
    target = self._structure(len(self) + len(ids))
    if self.structure != target:  # crossed a size threshold: move existing vectors to the new structure
      old_ids, old_vecs = self._all()
      self.index = self._new_index(target, train=np.concatenate([old_vecs, vectors]))
      if len(old_ids):
        self.index.add_with_ids(old_vecs, old_ids)
    elif target == "ivf" and not self.index.is_trained:
      self.index = self._new_index("ivf", train=vectors)
    int_ids = np.arange(self._next_id, self._next_id + len(ids), dtype=np.int64)
    self.index.add_with_ids(vectors, int_ids)
    self._next_id += len(ids)
    self._str_to_int.update(zip(ids, int_ids.tolist()))
    self._int_to_str.update(zip(int_ids.tolist(), ids))

  def upsert(self, ids: Sequence[str], vectors: np.ndarray) -> None:
    """Adds ids, replacing the vectors of those already present."""
    ids, vectors = self._check(ids, vectors)
    self.delete([s for s in ids if s in self._str_to_int])
    self.add(ids, vectors)

  def delete(self, ids: Sequence[str]) -> int:
    """Removes the ids present; returns how many were removed (absent ids are ignored)."""
    if isinstance(ids, str):
      raise TypeError("ids must be a sequence of strings, not one string")
    int_ids = np.array([self._str_to_int[s] for s in set(ids) if s in self._str_to_int], np.int64)
    if not len(int_ids):
      return 0
    if self.structure == "hnsw":
      keep_ids, _ = self._all()
      keep = ~np.isin(keep_ids, int_ids)
      vecs = np.stack([self.index.reconstruct(int(i)) for i in keep_ids[keep]]) if keep.any() else None
      self.index = self._new_index("hnsw", train=None)
      if vecs is not None:
        self.index.add_with_ids(vecs, keep_ids[keep])
    else:
      self.index.remove_ids(faiss.IDSelectorArray(int_ids))  # Array: IVF hashtable map needs it
    for i in int_ids.tolist():
      del self._str_to_int[self._int_to_str.pop(i)]
    return len(int_ids)

  # ---- queries ---------------------------------------------------------------------------------
  def __len__(self) -> int:
    return len(self._str_to_int)

  def __contains__(self, id_: str) -> bool:
    return id_ in self._str_to_int

  @property
  def ids(self) -> list[str]:
    """Stored ids in insertion order."""
    return list(self._str_to_int)

  def get(self, ids: Sequence[str]) -> np.ndarray:
    """Stored vectors [len(ids), d]; KeyError names a missing id."""
    missing = [s for s in ids if s not in self._str_to_int]
    if missing:
      raise KeyError(f"id {missing[0]!r} not in index")
    return np.stack([self.index.reconstruct(self._str_to_int[s]) for s in ids]) if len(ids) else \
        np.zeros((0, self.dim), np.float32)

  def search(self, query_vecs: np.ndarray, k: int, threads: int | None = None) -> list[list[tuple[str, float]]]:
    """Per query (rows of [Q, d], or one [d] vector), up to k (id, inner product), best first.

    FAISS runs on `threads` OpenMP threads, by default threads_for(Q, len(self), dim): one unless the batch
    is large enough to pay for more (retrieval.threads)."""
    q = np.asarray(query_vecs, np.float32)
    if q.ndim == 1:
      q = q[None]
    if q.ndim != 2 or q.shape[1] != self.dim:
      raise ValueError(f"query_vecs shape {np.shape(query_vecs)}: expected [Q, {self.dim}] or [{self.dim}]")
    if k < 1:
      raise ValueError(f"k={k}: must be >= 1")
    k = min(k, len(self))
    if k == 0 or not len(q):
      return [[] for _ in range(len(q))]
    with faiss_threads(threads, num_queries=len(q), num_vectors=len(self), dim=self.dim):
      scores, int_ids = self.index.search(np.ascontiguousarray(q), k)
    return [[(self._int_to_str[int(i)], float(s)) for s, i in zip(srow, irow) if i >= 0]
            for srow, irow in zip(scores, int_ids)]

  # ---- persistence -----------------------------------------------------------------------------
  def save(self, path: str | os.PathLike) -> None:
    """Writes folder `path` (index.faiss, meta.json) via a temporary folder and os.replace."""
    with atomic_dir(path) as tmp:
      faiss.write_index(self.index, str(tmp / "index.faiss"))
      meta = dict(format=_FORMAT, dim=self.dim, kind=self.kind, options=self.options, next_id=self._next_id,
                  ids=[[s, i] for s, i in self._str_to_int.items()])
      (tmp / "meta.json").write_text(json.dumps(meta))

  @classmethod
  def load(cls, path: str | os.PathLike) -> "DenseIndex":
    path = pathlib.Path(path)
    meta = read_meta(path, _FORMAT, "DenseIndex")
    self = cls(meta["dim"], meta["kind"], **meta["options"])
    self.index = faiss.read_index(str(path / "index.faiss"))
    if isinstance(self.index, faiss.IndexIVF):
      self.index.set_direct_map_type(faiss.DirectMap.Hashtable)
    self._next_id = meta["next_id"]
    self._str_to_int = {s: int(i) for s, i in meta["ids"]}
    self._int_to_str = {i: s for s, i in self._str_to_int.items()}
    if self.index.ntotal != len(self._str_to_int):
      raise ValueError(f"{path}: index holds {self.index.ntotal} vectors but meta.json {len(self._str_to_int)} ids")
    return self
