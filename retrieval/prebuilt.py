"""Search-R1's dense retriever as released: a prebuilt FAISS index and its JSON-lines corpus, served without
re-embedding anything.

Layout (Search-R1 `search_r1/search/index_builder.py`, written here by `python -m retrieval.build_index`):
  INDEX   a FAISS index (`{name}_Flat.index`: IndexFlatIP over L2-normalised passage embeddings, e.g.
          e5_Flat.index); vector i belongs to corpus record i
  CORPUS  JSON lines {"id": ..., "contents": "\\"Title\\"\\ntext"} (wiki-18.jsonl), record i = non-blank line i
Loading memory-maps what it can: the index with faiss.IO_FLAG_MMAP_IFC (flat codes) or IO_FLAG_MMAP, the
corpus through a byte-offset index (`retrieval.jsonl_corpus`). Queries are embedded with the index's
embedder and its query prefix (`prefixes`: e5 "query: " / "passage: ", bge a query instruction, others
none, as Search-R1's `Encoder.encode`); score = inner product. A hit's document is the corpus record itself
(Search-R1 returns `corpus[idx]`), so /retrieve answers field for field as their server does.
"""
from __future__ import annotations

import json
import os
import pathlib
from typing import Sequence

from retrieval.documents import Hit
from retrieval.jsonl_corpus import JsonlCorpus
from retrieval.lazy import lazy_import
from retrieval.threads import faiss_threads

faiss = lazy_import("faiss", "faiss-cpu")
META = "index_meta.json"
BGE_QUERY = "Represent this sentence for searching relevant passages: "


def prefixes(embedder: str) -> tuple[str, str]:
  """(query prefix, passage prefix) of an embedder, by name as Search-R1 decides: e5 -> ("query: ",
  "passage: "); bge -> (BGE_QUERY, ""); anything else (e.g. all-MiniLM-L6-v2) -> ("", "")."""
  name = str(embedder).lower()
  if "e5" in name:
    return "query: ", "passage: "
  if "bge" in name:
    return BGE_QUERY, ""
  return "", ""


def read_index(path: str | os.PathLike):
  """(faiss index, how it was read): memory-mapped flat codes, else memory-mapped, else read whole."""
  path = str(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no such index file")
  for how in ("IO_FLAG_MMAP_IFC", "IO_FLAG_MMAP"):
    flag = getattr(faiss, how, None)
    if flag is None:
      continue
    try:
      return faiss.read_index(path, flag | faiss.IO_FLAG_READ_ONLY), how
    except RuntimeError:
      continue
  return faiss.read_index(path), "read"


def index_meta(index_path: str | os.PathLike) -> dict:
  """The build_index metadata next to an index ({} for an index built elsewhere, e.g. Search-R1's)."""
  path = pathlib.Path(index_path).parent / META
  return json.loads(path.read_text()) if path.is_file() else {}


def search_r1_hit(record: dict, position: int, score: float) -> Hit:
  """A Hit whose document (metadata "search_r1_document") is the corpus record as stored."""
  contents = str(record.get("contents", record.get("text", "")))
  title, _, text = contents.partition("\n")
  return Hit(str(record.get("id", position)), float(score), text, {"search_r1_document": record},
             title.strip().strip('"'))


def check_sizes(index, corpus: JsonlCorpus) -> None:
  if index.ntotal != len(corpus):
    raise ValueError(f"the index holds {index.ntotal} vectors but the corpus {corpus.path} has {len(corpus)} "
                     "records; they must be built together")


class PrebuiltEngine:
  """search_batch(queries, k) -> [[Hit]] over a prebuilt index and its corpus (module docstring)."""

  def __init__(self, index, corpus: JsonlCorpus, embedder, query_prefix: str = "", batch_size: int = 64):
    check_sizes(index, corpus)
    if index.d != embedder.dim:
      raise ValueError(f"the index has dimension {index.d} but the embedder {embedder.name} gives {embedder.dim}")
    self.index, self.corpus, self.embedder = index, corpus, embedder
    self.query_prefix, self.batch_size = query_prefix, batch_size

  def __len__(self) -> int:
    return len(self.corpus)

  def search_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
    if isinstance(queries, str):
      raise TypeError("queries must be a sequence of strings, not one string")
    queries = list(queries)
    if not queries:
      return []
    k = min(int(k), len(self))
    emb = self.embedder.encode([self.query_prefix + q for q in queries], self.batch_size, False)
    with faiss_threads(num_queries=len(queries), num_vectors=self.index.ntotal, dim=self.index.d):
      scores, ids = self.index.search(emb, k)
    return [[search_r1_hit(self.corpus[int(i)], int(i), s) for i, s in zip(row_ids, row_scores) if i >= 0]
            for row_ids, row_scores in zip(ids, scores)]

  def search(self, query: str, k: int = 3) -> list[Hit]:
    return self.search_batch([query], k)[0]


def load_prebuilt(index_path, corpus_path, *, embedder: str = "", query_prefix: str | None = None,
                  backend: str = "jax", max_length: int = 256) -> PrebuiltEngine:
  """The engine of a prebuilt index: `embedder` "" = the one build_index recorded (else all-MiniLM-L6-v2);
  query_prefix None = recorded, else by the embedder's name (`prefixes`)."""
  from retrieval.embedder import Embedder
  meta = index_meta(index_path)
  name = embedder or meta.get("embedder", "all-MiniLM-L6-v2")
  if query_prefix is None:
    query_prefix = meta["query_prefix"] if "query_prefix" in meta and not embedder else prefixes(name)[0]
  index, _ = read_index(index_path)
  corpus = JsonlCorpus(corpus_path)
  check_sizes(index, corpus)  # before the embedder loads
  return PrebuiltEngine(index, corpus, Embedder.from_pretrained(name, backend=backend, max_length=max_length),
                        query_prefix)
