"""VectorStore: persistent collections (ChromaDB-like API) on SQLite + FAISS (retrieval.dense.DenseIndex).

Layout of `path/`: `store.sqlite3` (tables collections, records, meta — the source of truth, embeddings
included) and, per collection, `index/<name>/v<version>/` (a saved DenseIndex) named by `current.json`.
A write is one SQLite transaction that bumps the collection's `version`; then the FAISS index is saved
to a new folder and `current.json` replaced atomically. On open, an index whose version differs from
SQLite's (a process killed between the two steps) is rebuilt from the stored embeddings, so a reader
always sees the last committed state.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import sqlite3
import tempfile
from typing import Callable

import numpy as np

from retrieval.dense import DenseIndex

EmbeddingFunction = Callable[[list[str]], np.ndarray]
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
"""


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


def write_json_atomic(path: pathlib.Path, value) -> None:
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  with os.fdopen(fd, "w") as f:
    json.dump(value, f)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


class VectorStore:
  """A folder of named collections. `VectorStore(path)` creates the folder when missing."""

  def __init__(self, path: str | os.PathLike):
    self.path = pathlib.Path(path)
    if self.path.exists() and not self.path.is_dir():
      raise NotADirectoryError(f"{self.path}: VectorStore path exists and is not a folder")
    self.path.mkdir(parents=True, exist_ok=True)
    self.db = sqlite3.connect(self.path / "store.sqlite3", isolation_level=None, check_same_thread=False)
    self.db.execute("PRAGMA journal_mode=WAL")
    self.db.execute("PRAGMA foreign_keys=ON")
    self.db.executescript(_SCHEMA)
    self._collections: dict = {}

  def close(self) -> None:
    self.db.close()

  def list_collections(self) -> list[str]:
    return [r[0] for r in self.db.execute("SELECT name FROM collections ORDER BY name")]

  def get_or_create_collection(self, name: str, embedding_function: EmbeddingFunction | None = None,
                               metadata: dict | None = None, reranker=None):
    """The collection `name`, created when missing. embedding_function: texts -> float32 [N, d]
    (default: all-MiniLM-L6-v2, loaded lazily). reranker: an object with `.score(query, texts)`."""
    from memory.collection import Collection
    if not isinstance(name, str) or not _NAME.match(name):
      raise ValueError(f"collection name {name!r}: use 1-63 characters [A-Za-z0-9_.-], starting alphanumeric")
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
      self.db.execute("DELETE FROM collections WHERE name = ?", (name,))
    self._collections.pop(name, None)
    shutil.rmtree(self.path / "index" / name, ignore_errors=True)

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

  def version(self, name: str) -> tuple[int, int | None]:
    row = self.db.execute("SELECT version, dim FROM collections WHERE name = ?", (name,)).fetchone()
    if row is None:
      raise KeyError(f"{self.path}: collection {name!r} was deleted")
    return row

  def load_index(self, name: str, dim: int, version: int) -> DenseIndex:
    """The saved index of `version`, or one rebuilt from SQLite (and saved) when missing or stale."""
    folder = self.path / "index" / name
    current = folder / "current.json"
    if current.is_file():
      try:
        pointer = json.loads(current.read_text())
        if pointer["version"] == version:
          return DenseIndex.load(folder / pointer["dir"])
      except (ValueError, KeyError, OSError):
        pass  # unreadable pointer or index folder: rebuild below
    index = DenseIndex(dim)
    ids, blobs = [], []
    for id_, blob in self.db.execute("SELECT id, embedding FROM records WHERE collection = ? ORDER BY rid", (name,)):
      ids.append(id_)
      blobs.append(blob)
    if ids:
      index.add(ids, np.frombuffer(b"".join(blobs), np.float32).reshape(len(ids), dim))
    self.save_index(name, index, version)
    return index

  def save_index(self, name: str, index: DenseIndex, version: int) -> None:
    """Saves to index/<name>/v<version>, points current.json at it, removes other versions."""
    folder = self.path / "index" / name
    target = f"v{version}"
    index.save(folder / target)
    write_json_atomic(folder / "current.json", {"version": version, "dir": target})
    for old in folder.iterdir():
      if old.is_dir() and old.name != target:
        shutil.rmtree(old, ignore_errors=True)
