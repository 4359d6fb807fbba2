"""Search-R1's retriever as released: the corpus offsets index, build_index's layout, a prebuilt index
served equal to brute force over the same corpus, and /retrieve field for field against Search-R1's server
(its pydantic request model and response code transcribed below)."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import List, Optional

import numpy as np
import pytest
from pydantic import BaseModel

from retrieval.build_index import build
from retrieval.jsonl_corpus import JsonlCorpus
from retrieval.prebuilt import load_prebuilt, prefixes, read_index
from retrieval.server import RetrievalServer, retrieve_http

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "fineflax" / "data" / "samples" / "wiki_corpus.jsonl"
QUERIES = ["capital of varnholm", "who wrote the salt harbor opera", "comet discovered in 1955"]


class QueryRequest(BaseModel):  # Search-R1 search_r1/search/retrieval_server.py
  queries: List[str]
  topk: Optional[int] = None
  return_scores: bool = False


def search_r1_response(request: QueryRequest, corpus: list[dict], emb: np.ndarray, qemb: np.ndarray, default_topk=3):
  """Search-R1's retrieve_endpoint over DenseRetriever._batch_search (index.search = inner products,
  load_docs = corpus[idx]), transcribed; `emb`/`qemb` stand in for the FAISS index and the encoder."""
  if not request.topk:
    request.topk = default_topk
  scores_all = qemb @ emb.T
  idxs = np.argsort(-scores_all, axis=1, kind="stable")[:, :request.topk]
  results = [[corpus[int(i)] for i in row] for row in idxs]
  scores = [[float(scores_all[q, i]) for i in row] for q, row in enumerate(idxs)]
  resp = []
  for i, single_result in enumerate(results):
    if request.return_scores:
      resp.append([{"document": doc, "score": score} for doc, score in zip(single_result, scores[i])])
    else:
      resp.append(single_result)
  return {"result": resp}


@pytest.fixture(scope="module")
def minilm():
  from retrieval.embedder import Embedder
  return Embedder.from_pretrained("all-MiniLM-L6-v2")


@pytest.fixture(scope="module")
def built(tmp_path_factory, minilm):
  """The sample corpus with a blank line and a record holding an extra field; its index built with e5-style
  prefixes (MiniLM stands in for e5-base-v2, which is not installed here)."""
  folder = tmp_path_factory.mktemp("prebuilt")
  lines = SAMPLE.read_text().splitlines()
  extra = json.loads(lines[3])
  extra["source"] = "wiki-18"
  corpus = folder / "wiki.jsonl"
  corpus.write_text("\n".join(lines[:3] + ["", json.dumps(extra)] + lines[4:]) + "\n")
  index = build(corpus, folder / "index", embedder="all-MiniLM-L6-v2", passage_prefix="passage: ",
                query_prefix="query: ", show_progress=False)
  return corpus, index


@pytest.mark.fast
def test_corpus_offsets_give_each_record_and_are_cached(tmp_path):
  path = tmp_path / "c.jsonl"
  records = [{"id": str(i), "contents": f'"T{i}"\n' + "é" * i} for i in range(5)]
  path.write_text("\n".join([json.dumps(records[0]), "  ", *map(json.dumps, records[1:])]))  # no final newline
  corpus = JsonlCorpus(path)
  assert len(corpus) == 5 and [corpus[i] for i in range(5)] == records
  cache = tmp_path / "c.jsonl.offsets.npy"
  assert cache.exists() and JsonlCorpus(path).offsets.tolist() == corpus.offsets.tolist()
  stamp = cache.stat().st_mtime_ns
  JsonlCorpus(path)
  assert cache.stat().st_mtime_ns == stamp  # reused
  path.write_text(json.dumps(records[2]) + "\n")
  assert len(JsonlCorpus(path)) == 1 and JsonlCorpus(path)[0] == records[2]  # rebuilt for the new file
  with pytest.raises(IndexError):
    JsonlCorpus(path)[1]


@pytest.mark.fast
def test_prefixes_follow_search_r1():
  assert prefixes("intfloat/e5-base-v2") == ("query: ", "passage: ")
  assert prefixes("/models/e5-large-v2") == ("query: ", "passage: ")
  assert prefixes("BAAI/bge-large-en-v1.5")[0].startswith("Represent this sentence")
  assert prefixes("all-MiniLM-L6-v2") == ("", "")


def test_build_writes_the_layout_with_passage_prefixes(built, minilm):
  corpus_path, index_path = built
  assert index_path.name == "all_minilm_l6_v2_Flat.index"
  index, how = read_index(index_path)
  assert how == "IO_FLAG_MMAP_IFC" and index.ntotal == len(JsonlCorpus(corpus_path)) == 12
  meta = json.loads((index_path.parent / "index_meta.json").read_text())
  assert (meta["query_prefix"], meta["passage_prefix"], meta["dim"]) == ("query: ", "passage: ", 384)
  corpus = JsonlCorpus(corpus_path)
  expected = minilm.encode(["passage: " + corpus[i]["contents"] for i in range(len(corpus))])
  np.testing.assert_allclose(index.reconstruct_n(0, index.ntotal), expected, atol=1e-5)


@pytest.mark.parametrize("return_scores", [True, False])
def test_served_prebuilt_index_equals_search_r1_over_the_same_corpus(built, minilm, return_scores):
  corpus_path, index_path = built
  engine = load_prebuilt(index_path, corpus_path)  # no re-embedding of the corpus
  assert engine.query_prefix == "query: "
  records = [json.loads(line) for line in corpus_path.read_text().splitlines() if line.strip()]
  emb = minilm.encode(["passage: " + r["contents"] for r in records])  # the same corpus embedded now
  qemb = minilm.encode(["query: " + q for q in QUERIES])
  body = {"queries": QUERIES, "topk": 4, "return_scores": return_scores}
  expected = search_r1_response(QueryRequest(**body), records, emb, qemb)
  with RetrievalServer(engine, "127.0.0.1", 0, workers=1) as server:
    got = retrieve_http(server.url, QUERIES, topk=4, return_scores=return_scores)
  QueryRequest(**body)  # our client's body is a valid Search-R1 request
  if return_scores:
    assert [[h["document"] for h in row] for row in got] == [[h["document"] for h in row] for row in expected["result"]]
    np.testing.assert_allclose([[h["score"] for h in row] for row in got],
                               [[h["score"] for h in row] for row in expected["result"]], atol=1e-5)
    assert all(set(h) == {"document", "score"} for row in got for h in row)
  else:
    assert got == expected["result"]
  docs = [h["document"] if return_scores else h for row in got for h in row]
  assert {"id", "contents", "source"} in [set(d) for d in docs]  # the record as stored, extra field included


def test_server_command_line_serves_the_prebuilt_index(built):
  corpus_path, index_path = built
  proc = subprocess.Popen([sys.executable, "-m", "retrieval.server", "--index", str(index_path), "--corpus",
                           str(corpus_path), "--port", "0"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
  try:
    line = ""
    while "serving" not in line:
      line = proc.stderr.readline()
      assert line or proc.poll() is None, "the server exited"
    assert "serving 12 documents (prebuilt" in line
    url = line.rsplit(" on ", 1)[1].strip()
    got = retrieve_http(url, ["capital of varnholm"], topk=1)
    assert got[0][0]["document"]["contents"].startswith('"Varnholm"') or "Ostmar" in got[0][0]["document"]["contents"]
  finally:
    proc.terminate()
    proc.wait(timeout=30)


def test_a_corpus_that_does_not_match_the_index_is_refused(built, tmp_path):
  corpus_path, index_path = built
  short = tmp_path / "short.jsonl"
  short.write_text("\n".join(corpus_path.read_text().splitlines()[:5]) + "\n")
  out = subprocess.run([sys.executable, "-m", "retrieval.server", "--index", str(index_path), "--corpus", str(short),
                        "--port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2
  assert "the index holds 12 vectors but the corpus" in out.stderr and out.stderr.count("\n") == 1


@pytest.fixture(scope="module")
def tiny_e5(tmp_path_factory):
  """A tiny random BERT in an e5-named sentence-transformers folder (MiniLM's uncased WordPiece tokenizer,
  which e5-base-v2 shares; mean pooling), written by transformers."""
  import shutil

  import torch
  import transformers

  from retrieval.hf_model import resolve_model_folder
  minilm_dir = resolve_model_folder("all-MiniLM-L6-v2")
  folder = tmp_path_factory.mktemp("models") / "e5-tiny-v2"
  cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=128)
  torch.manual_seed(0)
  model = transformers.BertModel(cfg).eval()
  model.save_pretrained(folder)
  for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "modules.json",
               "1_Pooling"):
    src = minilm_dir / name
    (shutil.copytree if src.is_dir() else shutil.copy)(src, folder / name)
  return folder, model


def _torch_mean_pooled(model, folder, texts):
  """e5's embedding as its model card computes it: mean of the last hidden states over the mask, L2-normalised."""
  import torch
  import transformers
  tok = transformers.AutoTokenizer.from_pretrained(folder)
  batch = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
  with torch.no_grad():
    hidden = model(**batch).last_hidden_state
  mask = batch["attention_mask"][..., None].float()
  pooled = (hidden * mask).sum(1) / mask.sum(1)
  return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def test_an_e5_folder_gets_e5_prefixes_end_to_end(tiny_e5, tmp_path):
  """The e5 path itself (not only the name rule): build_index picks e5's name and passage prefix, the
  vectors equal transformers' mean-pooled encoding of "passage: " + text, and the served index prefixes
  queries with "query: " (top-k equal to a brute-force search with transformers' query vectors)."""
  folder, model = tiny_e5
  index_path = build(SAMPLE, tmp_path / "index", embedder=str(folder), max_length=128, show_progress=False)
  assert index_path.name == "e5_Flat.index"
  meta = json.loads((index_path.parent / "index_meta.json").read_text())
  assert (meta["query_prefix"], meta["passage_prefix"]) == ("query: ", "passage: ")
  records = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
  emb = _torch_mean_pooled(model, folder, ["passage: " + r["contents"] for r in records])
  index, _ = read_index(index_path)
  np.testing.assert_allclose(index.reconstruct_n(0, index.ntotal), emb, atol=2e-5)
  engine = load_prebuilt(index_path, SAMPLE)
  assert engine.query_prefix == "query: "
  qemb = _torch_mean_pooled(model, folder, ["query: " + q for q in QUERIES])
  expected = search_r1_response(QueryRequest(queries=QUERIES, topk=3, return_scores=True), records, emb, qemb)
  with RetrievalServer(engine, "127.0.0.1", 0, workers=1) as server:
    got = retrieve_http(server.url, QUERIES, topk=3, return_scores=True)
  assert [[h["document"]["id"] for h in row] for row in got] == \
      [[h["document"]["id"] for h in row] for row in expected["result"]]
