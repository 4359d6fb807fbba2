"""Ingest a folder (code and documents) into a VectorStore collection, incrementally.

  python -m memory.ingest FOLDER --store PATH [--collection NAME] [--max-chars N]

Each file is chunked (memory.chunking), its chunks embedded from `Chunk.embedding_text()` and upserted
with metadata (path relative to FOLDER, kind, name, lines, file_hash = sha256 of the file bytes).
A file whose hash equals the stored one is skipped; a changed file's old chunks are deleted first; chunks
of files no longer in the folder are deleted.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import pathlib
import sys

from tqdm import tqdm

from memory.chunking import chunk_file, supported_extensions

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
  exts = set(supported_extensions())
  out = []
  for root, dirs, files in os.walk(folder):
    dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
    out += [pathlib.Path(root) / f for f in sorted(files) if pathlib.Path(f).suffix.lower() in exts]
  out.sort()
  return out[:max_files] if max_files else out


def ingest(folder: str | os.PathLike, collection, max_chars: int = 1200, batch_files: int = 16,
           max_files: int | None = None, progress: bool = True) -> IngestStats:
  """Brings `collection` in line with the files of `folder`; returns what changed."""
  folder = pathlib.Path(folder)
  if not folder.is_dir():
    raise NotADirectoryError(f"{folder}: not a folder")
  stats = IngestStats()
  stored = {}
  for meta in collection.get(include=("metadatas",))["metadatas"]:
    if "path" in meta and "file_hash" in meta:
      stored[meta["path"]] = meta["file_hash"]
  files = walk(folder, max_files)
  stats.files_seen = len(files)
  present = set()
  batch: list = []

  def flush():
    if not batch:
      return
    paths = sorted({c_meta["path"] for _, _, c_meta in batch})
    stats.chunks_deleted += collection.delete(where={"path": {"$in": paths}}) if paths else 0
    collection.upsert([b[0] for b in batch], documents=[b[1] for b in batch], metadatas=[b[2] for b in batch])
    stats.chunks_upserted += len(batch)
    batch.clear()

  changed_files = 0
  for path in tqdm(files, desc="ingest", unit="file", disable=not progress):
    rel = path.relative_to(folder).as_posix()
    present.add(rel)
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if stored.get(rel) == digest:
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
    for c in chunks:
      batch.append((c.id, c.embedding_text(), {**c.metadata(), "file_hash": digest}))
    changed_files += 1
    if changed_files % batch_files == 0:
      flush()
  flush()
  removed = sorted(set(stored) - present)
  if removed:
    stats.files_removed = len(removed)
    stats.chunks_deleted += collection.delete(where={"path": {"$in": removed}})
  return stats


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m memory.ingest", description=__doc__.split("\n\n")[0])
  parser.add_argument("folder", type=pathlib.Path)
  parser.add_argument("--store", required=True, type=pathlib.Path, help="VectorStore folder")
  parser.add_argument("--collection", default="default")
  parser.add_argument("--max-chars", type=int, default=1200, help="chunk size in non-whitespace characters")
  parser.add_argument("--max-files", type=int, default=None)
  args = parser.parse_args(argv)
  from memory.store import VectorStore
  store = VectorStore(args.store)
  stats = ingest(args.folder, store.get_or_create_collection(args.collection), args.max_chars,
                 max_files=args.max_files)
  for error in stats.errors:
    print(f"skipped {error}", file=sys.stderr)
  print({k: v for k, v in dataclasses.asdict(stats).items() if k != "errors"})
  return 0


if __name__ == "__main__":
  sys.exit(main())
