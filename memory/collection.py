"""Collection: add / upsert / update / delete / get / count / query over one named set of records, with
Chroma 1.5's semantics.

A record is (id: str, document: str | None, metadata: dict of str -> str|int|float|bool or a non-empty list
of one of those, embedding: float32 [d] stored and returned exactly as given).
- add: new ids are inserted; an id already present keeps its old record (logged warning).
- update: changes the given fields of present ids; a missing id is skipped (logged warning).
- upsert: inserts new ids; for present ids, like update. Metadata is merged into the stored metadata (a
  None value deletes its key); a document or embedding not given is kept. A new document without a new
  embedding is re-embedded.
- query distances per the collection's `hnsw:space` (memory.index: l2 squared by default, cosine, ip).
  Unfiltered queries use the index; filtered ones (where / where_document / ids) are scored exactly from
  the stored embeddings when at most max(4096, n / 4) records pass, else index candidates are
  post-filtered, widening k until enough pass.
"""
from __future__ import annotations

import json
import logging
from typing import Sequence

import numpy as np

from memory import filters
from memory.index import VectorIndex, distances, index_options

INCLUDE = ("documents", "metadatas", "embeddings", "distances")
log = logging.getLogger("memory.collection")
_CHUNK = 900  # ids per `IN (...)` lookup


def _vectors(values, dim: int | None, where: str) -> np.ndarray:
  v = np.asarray(values, np.float32)
  if v.ndim != 2 or (dim is not None and v.shape[1] != dim):
    raise ValueError(f"{where}: embeddings of shape {v.shape}, expected [N, {dim or 'd'}]")
  if not np.isfinite(v).all():
    raise ValueError(f"{where}: embeddings contain NaN or inf (row {int(np.where(~np.isfinite(v))[0][0])})")
  return np.ascontiguousarray(v)


def _blobs(rows, dim: int) -> np.ndarray:
  return np.frombuffer(b"".join(rows), np.float32).reshape(len(rows), dim) if rows else np.zeros((0, dim), np.float32)


class Collection:

  def __init__(self, store, name: str, embedding_function, reranker=None):
    self.store, self.name = store, name
    self.embedding_function, self.reranker = embedding_function, reranker
    self._index, self._version = None, None
    self._passing: dict = {}

  # ---- state ----------------------------------------------------------------------------------------
  @property
  def metadata(self) -> dict:
    return json.loads(self.store.db.execute("SELECT metadata FROM collections WHERE name = ?",
                                            (self.name,)).fetchone()[0])

  @property
  def dim(self) -> int | None:
    return self.store.version(self.name)[1]

  @property
  def space(self) -> str:
    return self.metadata.get("hnsw:space", "l2")

  def index(self) -> VectorIndex | None:
    """The in-memory index at the database's current version (built or caught up as needed); None if
    the collection never held a vector."""
    version, dim, floor = self.store.state(self.name)
    if dim is None:
      self._index, self._version = None, version
      return None
    if self._index is not None and self._version == version:
      return self._index
    if self._index is None or self._version < floor or self._index.dim != dim:
      self._index = self._build(dim)
    else:  # replay the ids other processes' writes touched
      ids = [r[0] for r in self.store.db.execute(
          "SELECT DISTINCT id FROM changes WHERE collection = ? AND version > ?", (self.name, self._version))]
      self._sync(ids)
    self._version = version
    return self._index

  def _build(self, dim: int) -> VectorIndex:
    row = self.store.db.execute("SELECT centroids, trained_n FROM collections WHERE name = ?",
                                (self.name,)).fetchone()
    centroids = None if row[0] is None else np.frombuffer(row[0], np.float32).reshape(-1, dim)
    self._index = VectorIndex(dim, **index_options(self.metadata, self.name), centroids=centroids,
                              trained_n=row[1])
    cursor = self.store.db.execute("SELECT id, embedding FROM records WHERE collection = ? ORDER BY rid",
                                   (self.name,))
    while True:
      rows = cursor.fetchmany(50_000)
      if not rows:
        break
      self._upsert_index([r[0] for r in rows], _blobs([r[1] for r in rows], dim))
    return self._index

  def _sync(self, ids: list[str]) -> None:
    """Brings the index's entries for `ids` in line with the records table."""
    dim = self._index.dim
    for start in range(0, len(ids), _CHUNK):
      part = ids[start:start + _CHUNK]
      rows = self.store.db.execute(f"SELECT id, embedding FROM records WHERE collection = ? AND id IN "
                                   f"({','.join('?' * len(part))})", [self.name, *part]).fetchall()
      present = {r[0] for r in rows}
      self._index.delete([s for s in part if s not in present])
      self._upsert_index([r[0] for r in rows], _blobs([r[1] for r in rows], dim))

  def _upsert_index(self, ids: list[str], vectors: np.ndarray) -> None:
    if ids and self._index.upsert(ids, vectors):  # IVF (re)trained: persist its centroids
      self.store.db.execute("UPDATE collections SET centroids = ?, trained_n = ? WHERE name = ?",
                            (self._index.centroids.tobytes(), self._index.trained_n, self.name))

  def count(self) -> int:
    return self.store.db.execute("SELECT count(*) FROM records WHERE collection = ?", (self.name,)).fetchone()[0]

  # ---- writes -----------------------------------------------------------------------------------------
  def _embed(self, documents: list[str], where: str) -> np.ndarray:
    out = np.asarray(self.embedding_function(list(documents)), np.float32)
    if out.ndim != 2 or len(out) != len(documents):
      raise ValueError(f"{where}: embedding_function returned shape {out.shape} for {len(documents)} texts")
    return out

  def _rows(self, ids, documents, embeddings, metadatas, op: str) -> list[str]:
    if isinstance(ids, str) or not isinstance(ids, Sequence):
      raise TypeError(f"{self.name}.{op}: ids must be a list of strings, got {type(ids).__name__}")
    ids = list(ids)
    for i, id_ in enumerate(ids):
      if not isinstance(id_, str) or not id_:
        raise ValueError(f"{self.name}.{op}: ids[{i}] = {id_!r} is not a non-empty string")
    if len(set(ids)) != len(ids):
      raise ValueError(f"{self.name}.{op}: duplicate id {next(s for s in ids if ids.count(s) > 1)!r}")
    for field, values in (("documents", documents), ("embeddings", embeddings), ("metadatas", metadatas)):
      if values is not None and len(values) != len(ids):
        raise ValueError(f"{self.name}.{op}: {len(values)} {field} for {len(ids)} ids")
    for i, meta in enumerate(metadatas or []):
      if meta is not None and not isinstance(meta, dict):
        raise ValueError(f"{self.name}.{op}: metadatas[{i}] is {type(meta).__name__}, expected dict")
      for key in meta or {}:
        if not isinstance(key, str) or not key or key.startswith("$"):
          raise ValueError(f"{self.name}.{op}: metadatas[{i}] key {key!r}: use a non-empty string not starting with $")
      filters.meta_rows(meta or {}, f"{self.name}.{op}: metadatas[{i}]")
    return ids

  def _old(self, ids: list[str]) -> dict:
    """id -> (rid, document, metadata json, embedding blob) of the present ids."""
    out = {}
    for start in range(0, len(ids), _CHUNK):
      part = ids[start:start + _CHUNK]
      q = f"SELECT id, rid, document, metadata, embedding FROM records WHERE collection = ? AND id IN ({','.join('?' * len(part))})"
      out.update({r[0]: r[1:] for r in self.store.db.execute(q, [self.name, *part])})
    return out

  def _write(self, ids, documents, embeddings, metadatas, op: str) -> None:
    at = f"{self.name}.{op}"
    ids = self._rows(ids, documents, embeddings, metadatas, op)
    if op != "update" and documents is None and embeddings is None:
      raise ValueError(f"{at}: give documents or embeddings")
    keep = list(range(len(ids)))
    if op in ("add", "update"):  # skip what Chroma ignores before embedding anything
      old = self._old(ids)
      keep = [i for i, s in enumerate(ids) if (s in old) == (op == "update")]
      if len(keep) < len(ids):
        skipped = [s for i, s in enumerate(ids) if i not in set(keep)]
        log.warning("%s: %d %s ignored (first %r)", at, len(skipped),
                    "id(s) already present, kept the stored records" if op == "add" else "missing id(s)", skipped[0])
    pick = lambda values: None if values is None else [values[i] for i in keep]  # noqa: E731
    ids, documents, metadatas = pick(ids), pick(documents), pick(metadatas)
    embeddings = None if embeddings is None else np.asarray(embeddings, np.float32)[keep] if keep else None
    if not ids:
      return
    vectors = None
    if embeddings is not None:
      vectors = _vectors(embeddings, self.dim, at)
    elif documents is not None:
      vectors = _vectors(self._embed(documents, at), self.dim, at)
    db = self.store.db
    with self.store.transaction():
      self.index()  # catch up with other writers while holding the write lock
      old = self._old(ids)
      updates, inserts, metas, moved = [], [], {}, []
      for i, id_ in enumerate(ids):
        given = metadatas[i] if metadatas is not None else None
        if id_ in old:
          if op == "add":
            continue  # appeared since the check above: Chroma keeps the stored record
          rid, doc, meta_json, blob = old[id_]
          meta = {**json.loads(meta_json), **(given or {})}
          meta = {k: v for k, v in meta.items() if v is not None}
          doc = documents[i] if documents is not None else doc
          blob = vectors[i].tobytes() if vectors is not None else blob
          updates.append((doc, json.dumps(meta), blob, rid))
          metas[rid] = meta
        elif op == "update":
          continue  # deleted since the check above
        else:
          meta = {k: v for k, v in (given or {}).items() if v is not None}
          doc = documents[i] if documents is not None else None
          rid = db.execute("INSERT INTO records (collection, id, document, metadata, embedding) VALUES (?, ?, ?, ?, ?)",
                           (self.name, id_, doc, json.dumps(meta), vectors[i].tobytes())).lastrowid
          inserts.append(id_)
          metas[rid] = meta
        if vectors is not None:
          moved.append(i)
      if updates:
        db.executemany("UPDATE records SET document = ?, metadata = ?, embedding = ? WHERE rid = ?", updates)
        db.executemany("DELETE FROM meta WHERE rid = ?", [(u[3],) for u in updates])
      db.executemany("INSERT INTO meta (rid, key, t, s, n) VALUES (?, ?, ?, ?, ?)",
                     [(rid, *row) for rid, m in metas.items() for row in filters.meta_rows(m, at)])
      dim = self.dim
      if dim is None and vectors is not None:
        dim = vectors.shape[1]
        db.execute("UPDATE collections SET dim = ? WHERE name = ?", (dim, self.name))
      version = self.store.bump(self.name, [ids[i] for i in moved])
    if self._index is None and dim is not None:
      self._index = VectorIndex(dim, **index_options(self.metadata, self.name))
    if moved:
      self._upsert_index([ids[i] for i in moved], vectors[moved])
    self._version = version

  def add(self, ids, documents=None, embeddings=None, metadatas=None) -> None:
    """Adds new records; ids already present keep their stored record (logged warning). Documents are
    embedded when embeddings are None."""
    self._write(ids, documents, embeddings, metadatas, "add")

  def upsert(self, ids, documents=None, embeddings=None, metadatas=None) -> None:
    """Adds new records; updates present ones (merging metadata, keeping what is not given)."""
    self._write(ids, documents, embeddings, metadatas, "upsert")

  def update(self, ids, documents=None, embeddings=None, metadatas=None) -> None:
    """Changes the given fields of present records (missing ids skipped with a logged warning); metadata
    keys are merged, a None value deletes its key."""
    self._write(ids, documents, embeddings, metadatas, "update")

  def delete(self, ids: Sequence[str] | None = None, where: dict | None = None,
             where_document: dict | None = None) -> int:
    """Deletes records matching all of ids / where / where_document; returns how many."""
    if ids is None and not where and not where_document:
      raise ValueError(f"{self.name}.delete: give ids, where or where_document (use delete_collection to drop all)")
    with self.store.transaction():
      self.index()
      doomed = [r[0] for r in self._select("r.id", ids, where, where_document)]
      if not doomed:
        return 0
      for start in range(0, len(doomed), _CHUNK):
        part = doomed[start:start + _CHUNK]
        self.store.db.execute(f"DELETE FROM records WHERE collection = ? AND id IN ({','.join('?' * len(part))})",
                              [self.name, *part])
      version = self.store.bump(self.name, doomed)
    if self._index is not None:
      self._index.delete(doomed)
    self._version = version
    return len(doomed)

  # ---- reads -------------------------------------------------------------------------------------------
  def _select(self, columns: str, ids, where, where_document, extra: str = "") -> list:
    if isinstance(ids, str):
      raise TypeError(f"{self.name}: ids must be a list of strings, not one string")
    wsql, wp = filters.where_sql(where)
    dsql, dp = filters.where_document_sql(where_document)
    # `+r.collection`: without it SQLite scans the collection's rows (blobs included) and tests the
    # metadata subqueries per row; with it, it looks up the rids the subqueries return (13x faster at 20k)
    col_term = "+r.collection" if where and ids is None else "r.collection"
    sql = f"SELECT {columns} FROM records r WHERE {col_term} = ? AND ({wsql}) AND ({dsql})"
    if ids is None:
      return self.store.db.execute(sql + extra, [self.name, *wp, *dp]).fetchall()
    ids = list(dict.fromkeys(ids))
    if len(ids) < 1000:
      sql = sql.replace(f"({wsql})", f"({filters.correlated(wsql)})", 1)
    out = []
    for start in range(0, max(len(ids), 1), _CHUNK):
      part = ids[start:start + _CHUNK]
      args = [self.name, *wp, *dp, *part]
      out += self.store.db.execute(sql + f" AND r.id IN ({','.join('?' * len(part))})" + extra, args).fetchall()
    return out

  def get(self, ids: Sequence[str] | None = None, where: dict | None = None, where_document: dict | None = None,
          limit: int | None = None, offset: int = 0, include: Sequence[str] = ("documents", "metadatas")) -> dict:
    """{"ids": [...], "documents": [...], "metadatas": [...], "embeddings": [N, d]?} in insertion order."""
    _check_include(include)
    page = f" ORDER BY r.rid LIMIT {int(limit) if limit is not None else -1} OFFSET {int(offset)}"
    rows = self._select("r.rid, r.id, r.document, r.metadata, r.embedding", ids, where, where_document,
                        page if ids is None else "")
    if ids is not None:  # looked up in chunks: order and page here
      rows.sort(key=lambda r: r[0])
      rows = rows[int(offset):None if limit is None else int(offset) + int(limit)]
    out = {"ids": [r[1] for r in rows]}
    if "documents" in include:
      out["documents"] = [r[2] for r in rows]
    if "metadatas" in include:
      out["metadatas"] = [json.loads(r[3]) for r in rows]
    if "embeddings" in include:
      out["embeddings"] = _blobs([r[4] for r in rows], self.dim or 0)
    return out

  def peek(self, limit: int = 10) -> dict:
    return self.get(limit=limit)

  def _candidates(self, q: np.ndarray, k: int, where, where_document, ids) -> list[list[tuple[str, float]]]:
    """Per query row, up to k (id, distance) passing the filters, nearest first."""
    index = self.index()
    if index is None or not len(index):
      return [[] for _ in q]
    if not where and not where_document and ids is None:
      return index.search(q, k)
    n = len(index)
    key = (self._version, json.dumps(where, sort_keys=True), json.dumps(where_document, sort_keys=True),
           None if ids is None else tuple(ids))
    if key not in self._passing:  # how many records pass this filter, cached per collection version
      self._passing = {k: v for k, v in self._passing.items() if k[0] == self._version}
      self._passing[key] = len(self._select("r.rid", ids, where, where_document))
    passing = self._passing[key]
    if ids is not None or passing <= max(4096, n // 4):  # exact distances over the passing records
      rows = self._select("r.id, r.embedding", ids, where, where_document)
      if not rows:
        return [[] for _ in q]
      names = [r[0] for r in rows]
      dist = distances(q, _blobs([r[1] for r in rows], index.dim), index.space)
      out = []
      for row in dist:
        top = np.argpartition(row, min(k, len(row)) - 1)[:k] if len(row) > k else np.arange(len(row))
        top = top[np.argsort(row[top], kind="stable")]
        out.append([(names[i], float(row[i])) for i in top])
      return out
    out = []
    for qi in q:
      wide = min(n, k * max(2, 2 * n // max(passing, 1)))
      while True:
        hits = index.search(qi, wide)[0]
        ok = {r[0] for r in self._select("r.id", [h[0] for h in hits], where, where_document)}
        kept = [h for h in hits if h[0] in ok][:k]
        if len(kept) >= min(k, passing) or wide >= n:
          break
        wide = min(n, wide * 4)
      out.append(kept)
    return out

  def query(self, query_texts: Sequence[str] | str | None = None, query_embeddings=None, n_results: int = 10,
            where: dict | None = None, where_document: dict | None = None,
            include: Sequence[str] = ("documents", "metadatas", "distances"), rerank: bool = False,
            ids: Sequence[str] | None = None) -> dict:
    """Nearest records per query: {"ids": [[...]], "distances": [[...]], "documents": [[...]], ...}.
    ids: search only these records (with where / where_document, all must hold).

    rerank=True recalls 3 * n_results candidates, scores them with `self.reranker.score(query, documents)`
    and keeps the best n_results (also returned as "rerank_scores"); needs query_texts.
    """
    _check_include(include)
    if isinstance(query_texts, str):
      query_texts = [query_texts]
    if (query_texts is None) == (query_embeddings is None):
      raise ValueError(f"{self.name}.query: give exactly one of query_texts or query_embeddings")
    if not isinstance(n_results, int) or n_results < 1:
      raise ValueError(f"{self.name}.query: n_results={n_results!r} must be a positive int")
    if rerank and (query_texts is None or self.reranker is None):
      raise ValueError(f"{self.name}.query: rerank=True needs query_texts and a collection reranker")
    q = self._embed(query_texts, f"{self.name}.query") if query_embeddings is None else query_embeddings
    q = np.atleast_2d(np.asarray(q, np.float32))
    if self.dim is not None and q.shape[-1] != self.dim:
      raise ValueError(f"{self.name}.query: query vectors have {q.shape[-1]} dimensions but the collection "
                       f"holds {self.dim}; open it with the embedding_function it was built with")
    q = _vectors(q, self.dim, f"{self.name}.query")
    hits = self._candidates(q, n_results * (3 if rerank else 1), where, where_document, ids)
    found = list({h[0] for row in hits for h in row})
    records = {r[0]: r for r in self._select("r.id, r.document, r.metadata, r.embedding", found, None, None)} \
        if found else {}
    out: dict[str, list] = {"ids": [], **{key: [] for key in include}}
    if rerank:
      out["rerank_scores"] = []
    for qi, row in enumerate(hits):
      if rerank and row:
        scores = np.asarray(self.reranker.score(query_texts[qi], [records[h[0]][1] or "" for h in row]))
        order = np.argsort(-scores, kind="stable")[:n_results]
        out["rerank_scores"].append([float(scores[i]) for i in order])
        row = [row[i] for i in order]
      elif rerank:
        out["rerank_scores"].append([])
      out["ids"].append([h[0] for h in row])
      if "distances" in include:
        out["distances"].append([h[1] for h in row])
      if "documents" in include:
        out["documents"].append([records[h[0]][1] for h in row])
      if "metadatas" in include:
        out["metadatas"].append([json.loads(records[h[0]][2]) for h in row])
      if "embeddings" in include:
        out["embeddings"].append(_blobs([records[h[0]][3] for h in row], q.shape[1]))
    return out


def _check_include(include: Sequence[str]) -> None:
  bad = [x for x in include if x not in INCLUDE]
  if bad:
    raise ValueError(f"include: unknown field {bad[0]!r}; expected some of {INCLUDE}")
