"""Collection: add / upsert / update / delete / get / count / query over one named set of records.

A record is (id: str, document: str | None, metadata: dict of str -> str|int|float|bool, embedding).
Vectors are L2-normalised on the way in; query distances are cosine distances 1 - <q, d>.
Filtered queries: when at most max(4096, n / 4) records pass the filter they are scored exactly from
their stored embeddings; otherwise FAISS candidates are post-filtered, widening k until enough pass.
"""
from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from memory import filters

INCLUDE = ("documents", "metadatas", "embeddings", "distances")


def _normalise(vectors, dim: int | None, where: str) -> np.ndarray:
  v = np.asarray(vectors, np.float32)
  if v.ndim != 2 or (dim is not None and v.shape[1] != dim):
    raise ValueError(f"{where}: embeddings of shape {v.shape}, expected [N, {dim or 'd'}]")
  if not np.isfinite(v).all():
    raise ValueError(f"{where}: embeddings contain NaN or inf")
  norms = np.linalg.norm(v, axis=1, keepdims=True)
  if (norms == 0).any():
    raise ValueError(f"{where}: embedding row {int(np.where(norms[:, 0] == 0)[0][0])} is all zeros")
  return np.ascontiguousarray(v / norms)


class Collection:

  def __init__(self, store, name: str, embedding_function, reranker=None):
    self.store, self.name = store, name
    self.embedding_function, self.reranker = embedding_function, reranker
    self._index, self._version = None, None
    self._passing: dict = {}

  # ---- state ----------------------------------------------------------------------------------------
  @property
  def dim(self) -> int | None:
    return self.store.version(self.name)[1]

  def index(self):
    """The DenseIndex matching SQLite's version (reloaded when another process wrote), or None if empty."""
    version, dim = self.store.version(self.name)
    if dim is None:
      return None
    if self._index is None or self._version != version:
      self._index, self._version = self.store.load_index(self.name, dim, version), version
    return self._index

  def count(self) -> int:
    return self.store.db.execute("SELECT count(*) FROM records WHERE collection = ?", (self.name,)).fetchone()[0]

  # ---- writes -----------------------------------------------------------------------------------------
  def _embed(self, documents: list[str], where: str) -> np.ndarray:
    out = np.asarray(self.embedding_function(list(documents)), np.float32)
    if out.ndim != 2 or len(out) != len(documents):
      raise ValueError(f"{where}: embedding_function returned shape {out.shape} for {len(documents)} texts")
    return out

  def _rows(self, ids, documents, embeddings, metadatas, op: str):
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
      for key, value in (meta or {}).items():
        if not isinstance(key, str) or not key or key.startswith("$"):
          raise ValueError(f"{self.name}.{op}: metadatas[{i}] key {key!r}: use a non-empty string not starting with $")
        if value is not None:
          filters.typed(value, f"{self.name}.{op}: metadatas[{i}][{key!r}]")
    return ids

  def _write(self, ids, documents, embeddings, metadatas, op: str) -> None:
    ids = self._rows(ids, documents, embeddings, metadatas, op)
    if not ids:
      return
    if op != "update" and documents is None and embeddings is None:
      raise ValueError(f"{self.name}.{op}: give documents or embeddings")
    db = self.store.db
    old = {}
    if op == "update":
      q = f"SELECT id, document, metadata, embedding FROM records WHERE collection = ? AND id IN ({','.join('?' * len(ids))})"
      old = {r[0]: r[1:] for r in db.execute(q, [self.name, *ids])}
      missing = [s for s in ids if s not in old]
      if missing:
        raise KeyError(f"{self.name}.update: id {missing[0]!r} not in collection ({len(missing)} missing)")
    vectors = None
    if embeddings is not None:
      vectors = np.asarray(embeddings, np.float32)
    elif documents is not None:
      vectors = self._embed(documents, f"{self.name}.{op}")
    dim = self.dim
    if vectors is not None:
      vectors = _normalise(vectors, dim, f"{self.name}.{op}")
    index = self.index()
    rows, metas = [], []
    for i, id_ in enumerate(ids):
      doc = documents[i] if documents is not None else (old[id_][0] if op == "update" else None)
      meta = metadatas[i] if metadatas is not None else None
      if op == "update":
        meta = {**json.loads(old[id_][1]), **(meta or {})}
      meta = {k: v for k, v in (meta or {}).items() if v is not None}
      vec = vectors[i].tobytes() if vectors is not None else old[id_][2]
      rows.append((self.name, id_, doc, json.dumps(meta), vec))
      metas.append(meta)
    with self.store.transaction():
      if op == "add":
        q = f"SELECT id FROM records WHERE collection = ? AND id IN ({','.join('?' * len(ids))})"
        present = [r[0] for r in db.execute(q, [self.name, *ids])]
        if present:
          raise ValueError(f"{self.name}.add: id {present[0]!r} already exists ({len(present)} present); use upsert")
      else:
        db.executemany("DELETE FROM records WHERE collection = ? AND id = ?", [(self.name, s) for s in ids])
      db.executemany("INSERT INTO records (collection, id, document, metadata, embedding) VALUES (?, ?, ?, ?, ?)", rows)
      first = db.execute("SELECT rid FROM records WHERE collection = ? AND id = ?", (self.name, ids[0])).fetchone()[0]
      db.executemany("INSERT INTO meta (rid, key, t, s, n) VALUES (?, ?, ?, ?, ?)",
                     [(first + i, k, *filters.typed(v, k)) for i, m in enumerate(metas) for k, v in m.items()])
      if dim is None:
        dim = vectors.shape[1]
        db.execute("UPDATE collections SET dim = ? WHERE name = ?", (dim, self.name))
      db.execute("UPDATE collections SET version = version + 1 WHERE name = ?", (self.name,))
      version = db.execute("SELECT version FROM collections WHERE name = ?", (self.name,)).fetchone()[0]
    if index is None:
      from retrieval.dense import DenseIndex
      index = DenseIndex(dim)
    if vectors is not None:
      index.upsert(ids, vectors)
    self.store.save_index(self.name, index, version)
    self._index, self._version = index, version

  def add(self, ids, documents=None, embeddings=None, metadatas=None) -> None:
    """Adds new records; ValueError if an id exists. Documents are embedded when embeddings are None."""
    self._write(ids, documents, embeddings, metadatas, "add")

  def upsert(self, ids, documents=None, embeddings=None, metadatas=None) -> None:
    """Adds records, replacing existing ones entirely."""
    self._write(ids, documents, embeddings, metadatas, "upsert")

  def update(self, ids, documents=None, embeddings=None, metadatas=None) -> None:
    """Changes given fields of existing records (KeyError if missing); metadata keys are merged, None deletes one."""
    self._write(ids, documents, embeddings, metadatas, "update")

  def delete(self, ids: Sequence[str] | None = None, where: dict | None = None,
             where_document: dict | None = None) -> int:
    """Deletes records matching all of ids / where / where_document; returns how many."""
    if ids is None and not where and not where_document:
      raise ValueError(f"{self.name}.delete: give ids, where or where_document (use delete_collection to drop all)")
    doomed = self.get(ids=ids, where=where, where_document=where_document, include=())["ids"]
    if not doomed:
      return 0
    index = self.index()
    with self.store.transaction():
      self.store.db.executemany("DELETE FROM records WHERE collection = ? AND id = ?", [(self.name, s) for s in doomed])
      self.store.db.execute("UPDATE collections SET version = version + 1 WHERE name = ?", (self.name,))
      version = self.store.version(self.name)[0]
    index.delete(doomed)
    self.store.save_index(self.name, index, version)
    self._index, self._version = index, version
    return len(doomed)

  # ---- reads -------------------------------------------------------------------------------------------
  def _select(self, columns: str, ids, where, where_document, extra: str = "", params=()) -> list:
    wsql, wp = filters.where_sql(where)
    if ids is not None and len(ids) < 1000:
      wsql = filters.correlated(wsql)
    dsql, dp = filters.where_document_sql(where_document)
    sql = f"SELECT {columns} FROM records r WHERE r.collection = ? AND ({wsql}) AND ({dsql})"
    args = [self.name, *wp, *dp]
    if ids is not None:
      if isinstance(ids, str):
        raise TypeError(f"{self.name}: ids must be a list of strings, not one string")
      sql += f" AND r.id IN ({','.join('?' * len(ids))})"
      args += list(ids)
    return self.store.db.execute(sql + extra, args + list(params)).fetchall()

  def get(self, ids: Sequence[str] | None = None, where: dict | None = None, where_document: dict | None = None,
          limit: int | None = None, offset: int = 0, include: Sequence[str] = ("documents", "metadatas")) -> dict:
    """{"ids": [...], "documents": [...], "metadatas": [...], "embeddings": [N, d]?} in insertion order."""
    _check_include(include)
    extra = f" ORDER BY r.rid LIMIT {int(limit) if limit is not None else -1} OFFSET {int(offset)}"
    rows = self._select("r.id, r.document, r.metadata, r.embedding", ids, where, where_document, extra)
    out = {"ids": [r[0] for r in rows]}
    if "documents" in include:
      out["documents"] = [r[1] for r in rows]
    if "metadatas" in include:
      out["metadatas"] = [json.loads(r[2]) for r in rows]
    if "embeddings" in include:
      out["embeddings"] = np.frombuffer(b"".join(r[3] for r in rows), np.float32).reshape(len(rows), -1)
    return out

  def peek(self, limit: int = 10) -> dict:
    return self.get(limit=limit)

  def _candidates(self, q: np.ndarray, k: int, where, where_document) -> list[list[tuple[str, float]]]:
    """Per query row, up to k (id, inner product) passing the filters, best first."""
    index = self.index()
    if index is None or not len(index):
      return [[] for _ in q]
    if not where and not where_document:
      return index.search(q, k)
    n = len(index)
    key = (self._version, json.dumps(where, sort_keys=True), json.dumps(where_document, sort_keys=True))
    if key not in self._passing:  # how many records pass this filter, cached per collection version
      self._passing = {k: v for k, v in self._passing.items() if k[0] == self._version}
      self._passing[key] = self._select("count(*)", None, where, where_document)[0][0]
    passing = self._passing[key]
    if passing <= max(4096, n // 4):  # exact scores over the passing records
      rows = self._select("r.id, r.embedding", None, where, where_document)
      if not rows:
        return [[] for _ in q]
      ids = [r[0] for r in rows]
      scores = q @ np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(len(rows), -1).T
      out = []
      for row in scores:
        top = np.argpartition(-row, min(k, len(row)) - 1)[:k] if len(row) > k else np.arange(len(row))
        top = top[np.argsort(-row[top], kind="stable")]
        out.append([(ids[i], float(row[i])) for i in top])
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
            include: Sequence[str] = ("documents", "metadatas", "distances"), rerank: bool = False) -> dict:
    """Nearest records per query: {"ids": [[...]], "distances": [[...]], "documents": [[...]], ...}.

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
    q = _normalise(q, self.dim, f"{self.name}.query")
    hits = self._candidates(q, n_results * (3 if rerank else 1), where, where_document)
    found = {h[0] for row in hits for h in row}
    records = {r[0]: r for r in self._select("r.id, r.document, r.metadata, r.embedding", list(found), None, None)}
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
        out["distances"].append([1.0 - h[1] for h in row])
      if "documents" in include:
        out["documents"].append([records[h[0]][1] for h in row])
      if "metadatas" in include:
        out["metadatas"].append([json.loads(records[h[0]][2]) for h in row])
      if "embeddings" in include:
        out["embeddings"].append(np.frombuffer(b"".join(records[h[0]][3] for h in row), np.float32).reshape(len(row), -1))
    return out


def _check_include(include: Sequence[str]) -> None:
  bad = [x for x in include if x not in INCLUDE]
  if bad:
    raise ValueError(f"include: unknown field {bad[0]!r}; expected some of {INCLUDE}")
