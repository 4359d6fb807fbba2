"""Writes Search-R1's index layout from a JSON-lines corpus (what `retrieval.server --index` serves).

  python -m retrieval.build_index --corpus wiki.jsonl --out DIR [--embedder all-MiniLM-L6-v2 | PATH]
      -> DIR/{name}_Flat.index   faiss IndexFlatIP of normalize(embed(passage_prefix + contents)) per record,
                                 in corpus order (Search-R1's index_builder.py with faiss_type Flat)
         DIR/index_meta.json     embedder, prefixes, dimension, count, corpus size (read by the server)
The corpus is read record by record (`retrieval.jsonl_corpus`), never whole; each record's text is its
"contents" (Search-R1's), else `"title"\\ntext` from "title"/"text". Prefixes follow the embedder's name
(`retrieval.prebuilt.prefixes`: e5 "passage: "); --passage-prefix overrides. Files are replaced atomically.
Exit 2 with one line for a bad corpus or embedder.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

from fineflax.io import atomic_path, atomic_write_json
from retrieval.jsonl_corpus import JsonlCorpus
from retrieval.lazy import lazy_import
from retrieval.prebuilt import META, prefixes

faiss = lazy_import("faiss", "faiss-cpu")


def record_text(record: dict, where: str) -> str:
  if "contents" in record:
    return str(record["contents"])
  if "text" in record:
    return f'"{record.get("title", "")}"\n{record["text"]}'
  raise ValueError(f"{where}: no 'contents' (or 'text') field; keys {sorted(record)}")


def default_name(embedder: str) -> str:
  """Search-R1 names the index by retriever ("e5_Flat.index"); else the embedder folder's last part."""
  if "e5" in embedder.lower():
    return "e5"
  return "".join(c if c.isalnum() else "_" for c in pathlib.Path(embedder).name.lower()).strip("_") or "dense"


def build(corpus_path, out_dir, *, embedder: str = "all-MiniLM-L6-v2", name: str = "",
          passage_prefix: str | None = None, query_prefix: str | None = None, batch_size: int = 256,
          max_length: int = 256, backend: str = "jax", show_progress: bool = True) -> pathlib.Path:
  """Builds the index (module docstring); returns its path."""
  from retrieval.embedder import Embedder
  corpus = JsonlCorpus(corpus_path)
  if not len(corpus):
    raise ValueError(f"{corpus.path}: the corpus has no records")
  q_default, p_default = prefixes(embedder)
  passage_prefix = p_default if passage_prefix is None else passage_prefix
  query_prefix = q_default if query_prefix is None else query_prefix
  model = Embedder.from_pretrained(embedder, backend=backend, max_length=max_length)
  index = faiss.IndexFlatIP(model.dim)
  t0 = time.time()
  for start in range(0, len(corpus), batch_size):
    chunk = [passage_prefix + record_text(corpus[i], f"{corpus.path}: record {i}")
             for i in range(start, min(start + batch_size, len(corpus)))]
    index.add(model.encode(chunk, batch_size, False))
    if show_progress and (start // batch_size) % 50 == 0:
      print(f"  {start + len(chunk)}/{len(corpus)} records, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  path = out / f"{name or default_name(embedder)}_Flat.index"
  with atomic_path(path) as tmp:
    faiss.write_index(index, str(tmp))
  meta = {"embedder": embedder, "query_prefix": query_prefix, "passage_prefix": passage_prefix,
          "dim": model.dim, "count": index.ntotal, "index": path.name, "corpus": str(corpus.path),
          "corpus_bytes": corpus.path.stat().st_size, "max_length": max_length}
  atomic_write_json(out / META, meta)
  return path


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m retrieval.build_index", description=__doc__.split("\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
  ap.add_argument("--corpus", required=True, help="JSON lines {id, contents} (or {id, title?, text})")
  ap.add_argument("--out", required=True, help="output folder")
  ap.add_argument("--embedder", default="all-MiniLM-L6-v2", help="model folder or alias (e.g. an e5-base-v2 folder)")
  ap.add_argument("--name", default="", help="index name: NAME_Flat.index (default e5 for e5 models)")
  ap.add_argument("--passage-prefix", default=None, help="text put before each passage (default by embedder)")
  ap.add_argument("--query-prefix", default=None, help="recorded for the server (default by embedder)")
  ap.add_argument("--batch-size", type=int, default=256)
  ap.add_argument("--max-length", type=int, default=256, help="tokens per passage (Search-R1: 256)")
  ap.add_argument("--backend", default="jax", choices=("jax", "sentence-transformers"))
  args = ap.parse_args(argv)
  try:
    path = build(args.corpus, args.out, embedder=args.embedder, name=args.name, passage_prefix=args.passage_prefix,
                 query_prefix=args.query_prefix, batch_size=args.batch_size, max_length=args.max_length,
                 backend=args.backend)
  except (OSError, ValueError) as e:
    print(f"retrieval.build_index: error: {e}", file=sys.stderr)
    return 2
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
