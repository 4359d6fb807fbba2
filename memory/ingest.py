"""Ingest a folder (code and documents) into a VectorStore collection, incrementally.

  python -m memory.ingest FOLDER --store PATH [--collection NAME] [--max-chars N]

Each file is chunked (memory.chunking), its chunks embedded from `Chunk.embedding_text()` and upserted
with metadata (path relative to FOLDER, kind, name, lines, file_hash = sha256 of the file bytes).
A file whose chunks all carry its current hash is skipped; a changed file's old chunks are deleted first;
chunks of files no longer in the folder are deleted.

Crash safety: chunks are upserted with `file_hash = ""` (pending) and get their file's hash in one update
only after all of that file's chunks are stored, so a run killed between batches leaves the file pending
and the next run re-ingests it (its partial chunks deleted first: nothing lost, nothing duplicated).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import pathlib
import sys

from tqdm import tqdm

PENDING = ""  # the file_hash of a chunk whose file is not yet completely stored
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".tox", ".mypy_cache",
             ".pytest_cache", "build", "dist", "site-packages", ".eggs"}


@dataclasses.dataclass
class IngestStats:
  files_seen: int = 0
  files_skipped: int = 0        # unchanged since the last ingest
  files_ingested: int = 0
  files_removed: int = 0        # in the store but no longer in the folder
  chunks_upserted: int = 0
  chunks_deleted: int = 0
  errors: list = dataclasses.field(default_factory=list)


def walk(folder: pathlib.Path, max_files: int | None = None) -> list[pathlib.Path]:
  """Chunkable files under folder (hidden and build folders skipped), sorted."""
  from memory.chunking import supported_extensions  # tree-sitter: imported once the CLI checked it is there
  exts = set(supported_extensions())
  out = []
  for root, dirs, files in os.walk(folder):
    dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
    out += [pathlib.Path(root) / f for f in sorted(files) if pathlib.Path(f).suffix.lower() in exts]
  out.sort()
  return out[:max_files] if max_files else out


def ingest(folder: str | os.PathLike, collection, max_chars: int = 1200, batch_chunks: int = 64,
           max_files: int | None = None, progress: bool = True) -> IngestStats:
  """Brings `collection` in line with the files of `folder`; returns what changed.

  Two passes: chunk every new or changed file (fast), then embed and upsert their chunks in batches of
  about `batch_chunks`, with a progress bar counting chunks embedded (the slow part)."""
  from memory.chunking import chunk_file
  folder = pathlib.Path(folder)
  if not folder.is_dir():
    raise NotADirectoryError(f"{folder}: not a folder")
  stats = IngestStats()
  stored: dict[str, set[str]] = {}  # path -> the file_hash values of its chunks ("" = pending)
  for meta in collection.get(include=("metadatas",))["metadatas"]:
    if meta and "path" in meta and "file_hash" in meta:
      stored.setdefault(meta["path"], set()).add(meta["file_hash"])
  files = walk(folder, max_files)
  stats.files_seen = len(files)
  present, todo = set(), []  # todo: (path, [(id, embedding text, metadata)])
  for path in tqdm(files, desc="chunk", unit="file", disable=not progress, leave=False):
    rel = path.relative_to(folder).as_posix()
    present.add(rel)
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if stored.get(rel) == {digest}:
      stats.files_skipped += 1
      continue
    try:
      chunks = chunk_file(path, data.decode("utf-8", errors="replace"), max_chars, display_path=rel)
    except (ValueError, RecursionError) as e:
      stats.errors.append(f"{rel}: {e}")
      continue
    stats.files_ingested += 1
    if not chunks and rel in stored:
      stats.chunks_deleted += collection.delete(where={"path": rel})
    if chunks:
      todo.append((rel, digest, [(c.id, c.embedding_text(), {**c.metadata(), "file_hash": PENDING})
                                 for c in chunks]))
  bar = tqdm(total=sum(len(c) for _, _, c in todo), desc="embed", unit="chunk", disable=not progress)
  batch: list = []
  for i, (rel, digest, chunks) in enumerate(todo):
    batch.append((rel, digest, chunks))
    if sum(len(c) for _, _, c in batch) >= batch_chunks or i == len(todo) - 1:
      paths = [r for r, _, _ in batch if r in stored]
      if paths:  # a changed (or half-ingested) file's old chunks go first
        stats.chunks_deleted += collection.delete(where={"path": {"$in": paths}})
      rows = [row for _, _, c in batch for row in c]
      for a in range(0, len(rows), batch_chunks):
        part = rows[a:a + batch_chunks]
        collection.upsert([r[0] for r in part], documents=[r[1] for r in part], metadatas=[r[2] for r in part])
        stats.chunks_upserted += len(part)
        bar.update(len(part))
      # every chunk of these files is stored: now (and only now) their hashes, in one write
      collection.update([r[0] for _, _, c in batch for r in c],
                        metadatas=[{"file_hash": digest} for _, digest, c in batch for _ in c])
      batch.clear()
  bar.close()
  removed = sorted(set(stored) - present)
  if removed:
    stats.files_removed = len(removed)
    stats.chunks_deleted += collection.delete(where={"path": {"$in": removed}})
  return stats


def main(argv: list[str] | None = None) -> int:
  """The CLI. A user mistake (folder not a folder, store path a file, a package of the retrieval install
  missing) prints one line and returns 2, before anything is created."""
  parser = argparse.ArgumentParser(prog="python -m memory.ingest", description=__doc__.split("\n\n")[0])
  parser.add_argument("folder", type=pathlib.Path)
  parser.add_argument("--store", required=True, type=pathlib.Path, help="VectorStore folder (created if missing)")
  parser.add_argument("--collection", default="default")
  parser.add_argument("--max-chars", type=int, default=1200, help="chunk size in non-whitespace characters")
  parser.add_argument("--max-files", type=int, default=None)
  args = parser.parse_args(argv)
  from fineflax.extras import MEMORY, MissingExtra, require
  from memory.store import StoreError, VectorStore, check_store_path
  try:
    require("python -m memory.ingest", ("tree_sitter", "tree_sitter_python", *MEMORY))
    if not args.folder.is_dir():
      what = "does not exist" if not args.folder.exists() else "is not a folder"
      raise StoreError(f"{args.folder}: the folder to ingest {what}")
    check_store_path(args.store)
  except (StoreError, MissingExtra) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  store = VectorStore(args.store)
  collection = store.get_or_create_collection(args.collection, metadata={"hnsw:space": "cosine"})
  stats = ingest(args.folder, collection, args.max_chars, max_files=args.max_files)
  for error in stats.errors:
    print(f"skipped {error}", file=sys.stderr)
  print({k: v for k, v in dataclasses.asdict(stats).items() if k != "errors"})
  return 0


if __name__ == "__main__":
  sys.exit(main())
