"""VectorStore: persistent collections (Chroma-like API) in one SQLite database, searched in memory.

Layout of `path/`: `store.sqlite3` only, in WAL mode with synchronous=FULL (fsync per commit; NORMAL
with `fsync=False`). Tables: collections (name,
dim, metadata, version, IVF centroids), records (id, document, metadata, embedding as given), meta (typed
metadata values for filters), changes (collection, version, id: which ids each write touched).

Write cost is O(batch): a write is one SQLite transaction (appended to the write-ahead log and fsynced
before it returns; SQLite checkpoints the log into the database, which is the compaction) that bumps the
collection's `version` and logs the ids it touched in `changes`; the writer then updates its in-memory
index. Nothing else is saved, so the store is consistent after a SIGKILL at any point: a write is either
committed whole or absent. A process builds a collection's index (memory.index.VectorIndex) from the
stored embeddings when it first needs it, and catches up with other processes' writes by replaying the
`changes` rows above its version (rebuilding when the log was trimmed past it; the log keeps the last
`CHANGE_LOG_VERSIONS` versions).
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import sqlite3
from typing import Callable

import numpy as np

EmbeddingFunction = Callable[[list[str]], np.ndarray]
CHANGE_LOG_VERSIONS = 4096
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
  name TEXT PRIMARY KEY, dim INTEGER, metadata TEXT NOT NULL DEFAULT '{}', version INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS records (
  rid INTEGER PRIMARY KEY AUTOINCREMENT, collection TEXT NOT NULL, id TEXT NOT NULL, document TEXT,
  metadata TEXT NOT NULL, embedding BLOB NOT NULL, UNIQUE (collection, id));
CREATE TABLE IF NOT EXISTS meta (
  rid INTEGER NOT NULL REFERENCES records(rid) ON DELETE CASCADE, key TEXT NOT NULL, t TEXT NOT NULL,
  s TEXT, n REAL);
CREATE INDEX IF NOT EXISTS meta_s ON meta (key, s);
CREATE INDEX IF NOT EXISTS meta_n ON meta (key, n);
CREATE INDEX IF NOT EXISTS meta_rid ON meta (rid);
CREATE TABLE IF NOT EXISTS changes (collection TEXT NOT NULL, version INTEGER NOT NULL, id TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS changes_cv ON changes (collection, version);
"""
_ADDED_COLUMNS = {"centroids": "BLOB", "trained_n": "INTEGER NOT NULL DEFAULT 0",
                  "log_floor": "INTEGER NOT NULL DEFAULT 0"}


class StoreError(ValueError):
  """A store path that cannot be a VectorStore; the message names the path."""


def default_embedding_function() -> EmbeddingFunction:
  """all-MiniLM-L6-v2 through retrieval.embedder (loaded on first call)."""
  state = {}

  def embed(texts: list[str]) -> np.ndarray:
    if "model" not in state:
      from retrieval.embedder import Embedder
      state["model"] = Embedder.from_pretrained("all-MiniLM-L6-v2")
    return state["model"].encode(list(texts), batch_size=64, show_progress=False)
  embed.name = "all-MiniLM-L6-v2"
  return embed


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern:
  return re.compile(pattern)


def _regexp(pattern: str, text: str | None) -> int | None:
  """SQLite REGEXP(pattern, text): re.search, NULL for a NULL text."""
  return None if text is None else int(_compiled(pattern).search(text) is not None)


def check_store_path(path: str | os.PathLike, create: bool = True) -> pathlib.Path:
  """The store folder; StoreError when it is a file, or (create=False) missing or without a store."""
  path = pathlib.Path(path)
  if path.exists() and not path.is_dir():
    raise StoreError(f"{path}: store path exists and is not a folder")
  if not create and not (path / "store.sqlite3").is_file():
    what = "does not exist" if not path.exists() else "holds no store.sqlite3"
    raise StoreError(f"{path}: no vector store here (the folder {what}); build one with "
                     f"`python -m memory.ingest FOLDER --store {path}`")
  return path


class VectorStore:
  """A folder of named collections. `VectorStore(path)` creates the folder when missing;
  `VectorStore(path, create=False)` opens an existing store only (StoreError otherwise)."""

  def __init__(self, path: str | os.PathLike, create: bool = True, fsync: bool = True):
    """fsync=True (SQLite synchronous=FULL): a write is on disk when it returns, surviving power loss.
    fsync=False (synchronous=NORMAL): a returned write survives the process being killed, not a power
    cut (the store stays consistent either way); several times cheaper per small write."""
    self.path = check_store_path(path, create)
    self.path.mkdir(parents=True, exist_ok=True)
    self.db = sqlite3.connect(self.path / "store.sqlite3", isolation_level=None, check_same_thread=False,
                              timeout=60)
    self.db.execute("PRAGMA journal_mode=WAL")
    self.db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
    self.db.execute("PRAGMA foreign_keys=ON")
    self.db.create_function("regexp", 2, _regexp, deterministic=True)
    self.db.executescript(_SCHEMA)
    have = {r[1] for r in self.db.execute("PRAGMA table_info(collections)")}
    for column, decl in _ADDED_COLUMNS.items():  # stores written before these columns existed
      if column not in have:
        self.db.execute(f"ALTER TABLE collections ADD COLUMN {column} {decl}")
    self._collections: dict = {}

  def close(self) -> None:
    self.db.close()

  def list_collections(self) -> list[str]:
    return [r[0] for r in self.db.execute("SELECT name FROM collections ORDER BY name")]

  def get_or_create_collection(self, name: str, embedding_function: EmbeddingFunction | None = None,
                               metadata: dict | None = None, reranker=None):
    """The collection `name`, created when missing. embedding_function: texts -> float32 [N, d]
    (default: all-MiniLM-L6-v2, loaded lazily). metadata: Chroma's collection metadata; "hnsw:space" in
    l2 (default) / cosine / ip picks the distance; "index:kind" auto / flat / ivf, "index:ivf_threshold"
    and "index:nprobe" the index (memory.index). An existing collection keeps its stored metadata.
    reranker: an object with `.score(query, texts)`."""
    from memory.collection import Collection
    from memory.index import index_options
    if not isinstance(name, str) or not _NAME.match(name):
      raise ValueError(f"collection name {name!r}: use 1-63 characters [A-Za-z0-9_.-], starting alphanumeric")
    index_options(metadata or {}, f"collection {name!r} metadata")
    self.db.execute("INSERT OR IGNORE INTO collections (name, metadata) VALUES (?, ?)",
                    (name, json.dumps(metadata or {})))
    if name not in self._collections:
      self._collections[name] = Collection(self, name, embedding_function or default_embedding_function(),
                                           reranker)
    elif embedding_function is not None:
      self._collections[name].embedding_function = embedding_function
    return self._collections[name]

  def get_collection(self, name: str, embedding_function: EmbeddingFunction | None = None, reranker=None):
    """An existing collection; KeyError naming the known ones otherwise."""
    if name not in self.list_collections():
      raise KeyError(f"{self.path}: no collection {name!r} (have {self.list_collections()})")
    return self.get_or_create_collection(name, embedding_function, reranker=reranker)

  def delete_collection(self, name: str) -> None:
    with self.transaction():
      self.db.execute("DELETE FROM records WHERE collection = ?", (name,))
      self.db.execute("DELETE FROM changes WHERE collection = ?", (name,))
      self.db.execute("DELETE FROM collections WHERE name = ?", (name,))
    self._collections.pop(name, None)

  # ---- plumbing shared with Collection -----------------------------------------------------------
  def transaction(self):
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error) as a context manager."""
    store = self

    class _Tx:
      def __enter__(self):
        store.db.execute("BEGIN IMMEDIATE")

      def __exit__(self, exc_type, *_):
        store.db.execute("ROLLBACK" if exc_type else "COMMIT")
    return _Tx()

  def state(self, name: str) -> tuple[int, int | None, int]:
    """(version, dim, log_floor) of collection `name`."""
    row = self.db.execute("SELECT version, dim, log_floor FROM collections WHERE name = ?", (name,)).fetchone()
    if row is None:
      raise KeyError(f"{self.path}: collection {name!r} was deleted")
    return row

  def version(self, name: str) -> tuple[int, int | None]:
    return self.state(name)[:2]

  def bump(self, name: str, ids: list[str]) -> int:
    """Inside a transaction: version + 1, logs `ids` under it, trims the log; returns the new version."""
    self.db.execute("UPDATE collections SET version = version + 1 WHERE name = ?", (name,))
    version = self.state(name)[0]
    self.db.executemany("INSERT INTO changes (collection, version, id) VALUES (?, ?, ?)",
                        [(name, version, s) for s in ids])
    if version % 256 == 0 and version > CHANGE_LOG_VERSIONS:
      floor = version - CHANGE_LOG_VERSIONS
      self.db.execute("DELETE FROM changes WHERE collection = ? AND version <= ?", (name, floor))
      self.db.execute("UPDATE collections SET log_floor = ? WHERE name = ?", (floor, name))
    return version
