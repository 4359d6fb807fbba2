"""The arms of the RAG loop, run for real on the knowledge base: each arm's correctness on each question.

Arms (`fineflax.rag` variants over `retrieval/` engines of the KB corpus; dense = all-MiniLM-L6-v2):
  no_rag       no passages
  bm25_rag     naive RAG over BM25, k = 3
  dense_rag    naive RAG over the dense index, k = 3
  hybrid_rag   BM25 + dense fused by RRF, k = 3 (no cross-encoder: no trained checkpoint is available offline)
  agentic_rag  the Search-R1 loop (`fineflax.rag.agents.run_agentic`, `run_rollouts`) over the hybrid engine,
               k = 2 a search, at most 2 searches. Its model turns come from a RULE READER standing in for the
               LLM: search the question; if the passages say "born in <City>", search <City>; then answer
               (the country a passage names for the city, else "unknown").
Correctness (no generator here): 1 iff the question's gold passage is among the passages the arm put in
front of its generator (retrieval recall; for the agentic arm, every passage its searches returned).
"""
from __future__ import annotations

import re

import numpy as np

from fineflax.agents.llm import ScriptedLLM
from fineflax.rag.agents import context_messages, retrieve, run_agentic
from fineflax.rag.retrievers import passage_record
from fineflax.rag.spec import RagVariant

ARMS = {"no_rag": RagVariant("no_rag", "no_rag"),
        "bm25_rag": RagVariant("bm25_rag", "naive_rag", "bm25", k=3),
        "dense_rag": RagVariant("dense_rag", "naive_rag", "vector", k=3),
        "hybrid_rag": RagVariant("hybrid_rag", "hybrid_rag", "hybrid", k=3),
        "agentic_rag": RagVariant("agentic_rag", "agentic_rag", "hybrid", k=2, max_turns=2, max_turn_tokens=64)}


def build_engines(docs, embedder="all-MiniLM-L6-v2") -> dict:
  """{"bm25", "vector", "hybrid"}: retrieval engines over the corpus (one embedder, the corpus encoded once)."""
  from retrieval.embedder import Embedder
  from retrieval.engine import BM25SearchEngine, HybridSearchEngine, create_search_engine
  emb = Embedder.from_pretrained(embedder) if isinstance(embedder, str) else embedder
  vector = create_search_engine("vector", docs, embedder=emb)
  bm25 = create_search_engine("bm25", docs)
  hybrid = HybridSearchEngine(vector, BM25SearchEngine(bm25.bm25))
  hybrid.documents = dict(vector.documents)
  return {"bm25": bm25, "vector": vector, "hybrid": hybrid}


def rule_reader(tokenizer):
  """A fresh ScriptedLLM for one question (its call index is the turn): module docstring's reader."""
  def script(request, turn):
    text = tokenizer.decode(list(request), skip_special_tokens=True)
    question = re.search(r"Question: (.*?)\n", text).group(1).strip()
    infos = re.findall(r"<information>(.*?)</information>", text, re.S)
    if turn == 0:
      return f"<think>I need to look this up.</think>\n<search> {question} </search>"
    city = re.search(r"born in ([A-Z][a-z]+)", infos[-1]) if infos else None
    if city and turn == 1:
      return f"<think>Now the city.</think>\n<search> {city.group(1)} </search>"
    country = re.search(r"is a city in ([A-Z][a-z]+)", infos[-1]) if infos else None
    return f"<think>Done.</think>\n<answer> {country.group(1) if country else 'unknown'} </answer>"
  return lambda: ScriptedLLM(script, tokenizer=tokenizer)


def run_arm(name, question: str, engines, tokenizer) -> dict:
  """{"passages": [{id, title, text}], "input": messages the generator would answer from}."""
  v = ARMS[name]
  if v.kind == "agentic_rag":
    out = run_agentic(v, engines[v.retriever], question, rule_reader(tokenizer)(), tokenizer)
    return {"passages": out.passages, "input": out.input}
  hits = retrieve(v, engines.get(v.retriever), question)
  msgs = [{"role": "user", "content": question}]
  return {"passages": [passage_record(h) for h in hits], "input": context_messages(v, msgs, hits)}


def measure(questions, engines, tokenizer) -> tuple[dict, np.ndarray]:
  """({question id: {arm: run_arm output}}, correct [len(questions), len(ARMS)] in 0/1)."""
  runs, correct = {}, np.zeros((len(questions), len(ARMS)))
  for i, q in enumerate(questions):
    runs[q["id"]] = {a: run_arm(a, q["question"], engines, tokenizer) for a in ARMS}
    correct[i] = [float(q["gold"] in {p["id"] for p in runs[q["id"]][a]["passages"]}) for a in ARMS]
  return runs, correct
