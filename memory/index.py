"""VectorIndex: the in-memory nearest-neighbour index of one collection (string ids, Chroma's distances).

Distances, as Chroma's `hnsw:space` (d = stored vector, q = query):
  "l2":     ||q - d||^2 (squared, as hnswlib and Chroma)
  "ip":     1 - <q, d>
  "cosine": 1 - <q, d> / (||q|| ||d||)  (zero vectors count as 0-vectors after normalisation: distance 1)
Structures:
  "flat": exact. Vectors live in a NumPy buffer (capacity doubles); a delete moves the last row into the
          hole, so add / upsert / delete cost O(batch); search is `faiss.knn` over the buffer.
  "ivf":  faiss.IndexIVFFlat with a hash-table direct map (add / remove O(batch)); nlist = clip(sqrt(n), 16,
          4096) k-means centroids trained on at most 64 * nlist vectors; `nprobe` lists visited per query.
          Retrained from its own lists when it has grown 4x past its training size (amortised O(1)).
  "auto": flat until `ivf_threshold` vectors, then converted to ivf (one O(n) training, never back);
          "ivf" does the same from 1024 vectors.
Searches of fewer than memory.threads.BATCH queries run FAISS on one OpenMP thread.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from memory.threads import faiss_threads

SPACES = ("l2", "cosine", "ip")
BATCH_ALL = 1 << 30  # a query count that keeps FAISS's default thread count
KINDS = ("auto", "flat", "ivf")


def unit(v: np.ndarray) -> np.ndarray:
  """Rows divided by their L2 norm (zero rows stay zero)."""
  norms = np.linalg.norm(v, axis=-1, keepdims=True)
  return (v / np.where(norms == 0, 1, norms)).astype(np.float32)


def distances(q: np.ndarray, x: np.ndarray, space: str) -> np.ndarray:
  """Exact distances [len(q), len(x)] between raw query rows and raw stored rows in `space`."""
  q, x = np.asarray(q, np.float32), np.asarray(x, np.float32)
  if space == "cosine":
    return 1.0 - unit(q) @ unit(x).T
  if space == "ip":
    return 1.0 - q @ x.T
  sq = (q * q).sum(1)[:, None] + (x * x).sum(1)[None, :] - 2.0 * (q @ x.T)
  return np.maximum(sq, 0.0)


class VectorIndex:
  """upsert / delete / search over (string id, float32 vector) pairs in one distance space."""

  def __init__(self, dim: int, space: str = "l2", kind: str = "auto", *, ivf_threshold: int = 50_000,
               nprobe: int = 32, centroids: np.ndarray | None = None, trained_n: int = 0):
    if space not in SPACES:
      raise ValueError(f"hnsw:space={space!r}: choose one of {SPACES}")
    if kind not in KINDS:
      raise ValueError(f"index:kind={kind!r}: choose one of {KINDS}")
    self.dim, self.space, self.kind = int(dim), space, kind
    self.ivf_threshold, self.nprobe = int(ivf_threshold), int(nprobe)
    self._rows: list[str] = []            # flat: row -> id
    self._row: dict[str, int] = {}        # flat: id -> row; ivf: id -> label
    self._label_id: dict[int, str] = {}   # ivf: label -> id
    self._buf = np.zeros((0, self.dim), np.float32)
    self._next_label = 0
    self._ivf = None
    self.trained_n = int(trained_n)
    self._ivf_at = {"auto": self.ivf_threshold, "ivf": 1024}.get(kind)  # size that triggers training
    if centroids is not None:
      self._ivf = self._new_ivf(np.asarray(centroids, np.float32))

  # ---- structure -------------------------------------------------------------------------------
  @property
  def structure(self) -> str:
    return "flat" if self._ivf is None else "ivf"

  @property
  def centroids(self) -> np.ndarray | None:
    """The IVF coarse centroids [nlist, d] (what must be persisted to rebuild the index), or None."""
    if self._ivf is None:
      return None
    q = self._ivf.quantizer
    return q.reconstruct_n(0, q.ntotal)

  def _metric(self):
    import faiss
    return faiss.METRIC_L2 if self.space == "l2" else faiss.METRIC_INNER_PRODUCT

  def _new_ivf(self, centroids: np.ndarray):
    import faiss
    quantizer = faiss.IndexFlatL2(self.dim) if self.space == "l2" else faiss.IndexFlatIP(self.dim)
    quantizer.add(np.ascontiguousarray(centroids))
    ivf = faiss.IndexIVFFlat(quantizer, self.dim, len(centroids), self._metric())
    ivf.is_trained = True
    ivf.nprobe = min(self.nprobe, len(centroids))
    ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
    self._quantizer = quantizer  # the IVF index does not own its quantizer
    return ivf

  def train(self, vectors: np.ndarray, n: int | None = None) -> np.ndarray:
    """k-means centroids for `vectors` (already in index form: normalised for cosine), sized for n vectors
    (default len(vectors); pass the full size when `vectors` is a sample of it)."""
    import faiss
    n = len(vectors) if n is None else int(n)
    nlist = int(np.clip(np.sqrt(n), 16, 4096))
    sample = vectors
    if len(vectors) > 64 * nlist:
      sample = vectors[np.sort(np.random.default_rng(0).choice(len(vectors), 64 * nlist, replace=False))]
    km = faiss.Kmeans(self.dim, nlist, niter=10, seed=1234, spherical=self.space == "cosine",
                      max_points_per_centroid=64, min_points_per_centroid=1)
    with faiss_threads(BATCH_ALL):
      km.train(np.ascontiguousarray(sample, np.float32))
    self.trained_n = n
    return km.centroids

  def _all(self) -> tuple[list[str], np.ndarray]:
    """(ids, index-form vectors) of everything stored."""
    if self._ivf is None:
      return list(self._rows), self._buf[:len(self._rows)].copy()
    import faiss
    inv, ids, parts = self._ivf.invlists, [], []
    for lst in range(self._ivf.nlist):
      size = inv.list_size(lst)
      if size:
        codes = faiss.rev_swig_ptr(inv.get_codes(lst), size * inv.code_size).copy()
        parts.append(codes.view(np.float32).reshape(size, self.dim))
        ids += [self._label_id[int(x)] for x in faiss.rev_swig_ptr(inv.get_ids(lst), size)]
    return ids, np.concatenate(parts) if parts else np.zeros((0, self.dim), np.float32)

  def to_ivf(self) -> None:
    """(Re)trains the IVF centroids on everything stored and moves the vectors into it."""
    ids, vecs = self._all()
    centroids = self.train(vecs)
    self._rows, self._row, self._label_id, self._next_label = [], {}, {}, 0
    self._buf = np.zeros((0, self.dim), np.float32)
    self._ivf = self._new_ivf(centroids)
    self._add(ids, vecs)

  def __len__(self) -> int:
    return len(self._rows) if self._ivf is None else len(self._row)

  def __contains__(self, id_: str) -> bool:
    return id_ in self._row

  # ---- mutation --------------------------------------------------------------------------------
  def prepare(self, vectors) -> np.ndarray:
    """Raw vectors in index form: float32 [N, dim], unit rows for cosine."""
    v = np.asarray(vectors, np.float32).reshape(-1, self.dim)
    return np.ascontiguousarray(unit(v) if self.space == "cosine" else v)

  def _add(self, ids: list[str], vecs: np.ndarray) -> None:
    if not ids:
      return
    if self._ivf is None:
      n = len(self._rows)
      if n + len(ids) > len(self._buf):
        grown = np.zeros((max(2 * len(self._buf), n + len(ids), 1024), self.dim), np.float32)
        grown[:n] = self._buf[:n]
        self._buf = grown
      self._buf[n:n + len(ids)] = vecs
      self._row.update(zip(ids, range(n, n + len(ids))))
      self._rows += ids
      return
    labels = np.arange(self._next_label, self._next_label + len(ids), dtype=np.int64)
    self._next_label += len(ids)
    with faiss_threads(len(ids)):
      self._ivf.add_with_ids(vecs, labels)
    self._row.update(zip(ids, labels.tolist()))
    self._label_id.update(zip(labels.tolist(), ids))

  def upsert(self, ids: Sequence[str], vectors) -> bool:
    """Adds ids, replacing the vectors of those present. Returns True when the IVF centroids changed
    (the caller persists `centroids`)."""
    ids = list(ids)
    vecs = self.prepare(vectors)
    self.delete([s for s in ids if s in self._row])
    self._add(ids, vecs)
    grown = self._ivf is not None and self.trained_n > 0 and len(self) > 4 * self.trained_n
    if (self._ivf is None and self._ivf_at is not None and len(self) >= self._ivf_at) or grown:
      self.to_ivf()
      return True
    return False

  def delete(self, ids: Sequence[str]) -> int:
    """Removes the ids present; returns how many."""
    gone = [s for s in dict.fromkeys(ids) if s in self._row]
    if self._ivf is not None:
      labels = np.array([self._row.pop(s) for s in gone], np.int64)
      if len(labels):  # IDSelectorArray: the hash-table direct map removes each id in O(1), not a scan
        import faiss
        self._ivf.remove_ids(faiss.IDSelectorArray(len(labels), faiss.swig_ptr(labels)))
        for lab in labels.tolist():
          del self._label_id[lab]
      return len(gone)
    for s in gone:  # move the last row into the hole
      row, last = self._row.pop(s), len(self._rows) - 1
      if row != last:
        moved = self._rows[last]
        self._buf[row] = self._buf[last]
        self._rows[row] = moved
        self._row[moved] = row
      self._rows.pop()
    return len(gone)

  # ---- search ----------------------------------------------------------------------------------
  def search(self, q, k: int, threads: int | None = None) -> list[list[tuple[str, float]]]:
    """Per query row (raw), up to k (id, distance) nearest first."""
    import faiss
    q = self.prepare(np.atleast_2d(q))
    n = len(self)
    k = min(int(k), n)
    if k <= 0:
      return [[] for _ in q]
    with faiss_threads(len(q), threads):
      if self._ivf is None:
        scores, rows = faiss.knn(q, self._buf[:n], k, metric=self._metric())
        names = self._rows
      else:
        scores, rows = self._ivf.search(q, k)
        names = self._label_id
    out = []
    for srow, irow in zip(scores, rows):
      out.append([(names[int(i)], float(s if self.space == "l2" else 1.0 - s))
                  for s, i in zip(srow, irow) if i >= 0])
    return out


def index_options(metadata: dict, where: str) -> dict:
  """VectorIndex keyword arguments from collection metadata; ValueError naming a bad key."""
  space = metadata.get("hnsw:space", "l2")
  if space not in SPACES:
    raise ValueError(f"{where}: hnsw:space={space!r}; choose one of {SPACES}")
  kind = metadata.get("index:kind", "auto")
  if kind not in KINDS:
    raise ValueError(f"{where}: index:kind={kind!r}; choose one of {KINDS}")
  out = {"space": space, "kind": kind}
  for key, name in (("index:ivf_threshold", "ivf_threshold"), ("index:nprobe", "nprobe")):
    if key in metadata:
      value = metadata[key]
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {key}={value!r} must be a positive int")
      out[name] = value
  return out
