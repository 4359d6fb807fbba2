"""The untrained baselines of the Search-R1 experiment, on the held-out questions of each seed's run.

  direct       the base model answers from the question alone, inside <answer></answer>
  rag          retrieve once (top-k BM25 passages of the question) and answer, same instruction and tags
  oracle_rag   the passages of the oracle's searches (the scripted demonstration: one search for
               single-hop, two for two-hop questions) in the prompt: what the model does with the
               evidence that two searches would bring
  oracle_recall  share of questions whose gold answer is in the oracle's retrieved passages: the EM of a
               policy that searches like the oracle and reads the answer off correctly (the ceiling)

Scores: EM (SQuAD-normalised exact match of the <answer> content, else of the whole reply) and the
lenient `contains` (the normalised gold answer is inside the normalised reply). Searches per question
are 0, 1 and the oracle's count.
"""
from __future__ import annotations

import re
import types

import numpy as np

from fineflax.rewards.qa import extract_answer, normalize_answer

DIRECT = ("Answer the given question. Give only the short answer inside <answer> and </answer>, for "
          "example <answer> Beijing </answer>. Question: {question}\n")
RAG = ("Answer the given question using the documents. Give only the short answer inside <answer> and "
       "</answer>, for example <answer> Beijing </answer>.\nDocuments:\n{docs}Question: {question}\n")
_SEARCH = re.compile(r"<search>\s*(.*?)\s*</search>", re.S)


def oracle_queries(question) -> list[str]:
  """The queries of the question's scripted demonstration, in order."""
  return [m for turn in question.demo for m in _SEARCH.findall(turn)]


def answer_once(model, questions, template: str, docs=None, max_new_tokens: int = 32) -> list[str]:
  """Greedy single-turn replies of the base model (LoRA off): the <answer> content, else the whole text."""
  from fineflax.sampling import chat_prompt_ids, generate
  out, bs = [], model.batch_size
  for i in range(0, len(questions), bs):
    prompts = []
    for j, q in enumerate(questions[i:i + bs]):
      text = template.format(question=q.question, docs=docs[i + j] if docs else "")
      prompts.append(chat_prompt_ids(model.tok, [{"role": "user", "content": text}]))
    res = generate(model.base, model.model_config, prompts, max_new_tokens=max_new_tokens, temperature=0.0,
                   tokenizer=model.tok, stop_strings=("</answer>",), dtype=model.dtype)
    out += [extract_answer(t) if extract_answer(t) is not None else t.strip() for t in res.texts]
  return out


def scores(questions, answers, searches) -> dict:
  """EM (`em_metrics`, as the RL evaluation) and contains, all / single-hop / two-hop, and searches per
  question (all / by hops)."""
  from fineflax.envs.search_r1 import em_metrics
  contains = np.array([normalize_answer(q.answer) in normalize_answer(a or "") for q, a in zip(questions, answers)],
                      float)
  hops, searches = np.array([q.hops for q in questions]), np.asarray(searches, float)
  out = {**em_metrics(questions, answers, ""), "contains": float(contains.mean()), "searches": float(searches.mean())}
  for h in (1, 2):
    if (hops == h).any():
      out[f"contains_{h}hop"] = float(contains[hops == h].mean())
      out[f"searches_{h}hop"] = float(searches[hops == h].mean())
  return out


def run_baselines(config) -> dict:
  """{method: scores} on the held-out questions of `config` (its seed picks them, as in the RL run)."""
  from fineflax.envs.search_r1 import SearchR1Env
  from fineflax.train.model_setup import compute_dtype, setup_model
  from fineflax.search_r1 import format_passages
  base, model_config, tok, _, _ = setup_model(config)
  model = types.SimpleNamespace(base=base, model_config=model_config, tok=tok, dtype=compute_dtype(config),
                                batch_size=config.eval_batch_size)
  env = SearchR1Env(config, tok)
  qs = env.eval_items
  hits = env.search_fn([q.question for q in qs])
  oracle = [oracle_queries(q) for q in qs]
  flat = env.search_fn([x for qq in oracle for x in qq])
  oracle_docs, k = [], 0
  for qq in oracle:
    oracle_docs.append("".join(format_passages(h) for h in flat[k:k + len(qq)]))
    k += len(qq)
  n_oracle = [len(qq) for qq in oracle]
  recall = scores(qs, oracle_docs, n_oracle)  # a reader that never errs: its EM is the recall
  recall.update({k: recall[k.replace("em", "contains")] for k in list(recall) if k.startswith("em")})
  return {"direct": scores(qs, answer_once(model, qs, DIRECT), [0] * len(qs)),
          "rag": scores(qs, answer_once(model, qs, RAG, [format_passages(h) for h in hits]), [1] * len(qs)),
          "oracle_rag": scores(qs, answer_once(model, qs, RAG, oracle_docs), n_oracle),
          "oracle_recall": recall}
