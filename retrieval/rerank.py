"""Cross-encoder reranking: score(q, d) = act(tanh(BERT([CLS] q [SEP] d [SEP])_CLS Wp) Wc) for 1-label models.

act follows sentence-transformers' CrossEncoder: the activation named in config.json's
`sentence_transformers.activation_fn`, else sigmoid for one label and identity otherwise.
Two-phase use: recall a pool with a cheap retriever, then `rerank(query, hits, top_n)`.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Sequence

import jax
import numpy as np

from retrieval import bert
from retrieval.hf_model import load_tokenizer, resolve_model_folder, run_batched

BACKENDS = ("jax", "sentence-transformers")
ACTIVATIONS = ("auto", "identity", "sigmoid")


def _configured_activation(config: dict) -> str:
  name = str(config.get("sentence_transformers", {}).get("activation_fn", ""))
  if name.endswith("Identity"):
    return "identity"
  if name.endswith("Sigmoid"):
    return "sigmoid"
  return "sigmoid" if config.get("num_labels", len(config.get("id2label", {0: 0}))) == 1 else "identity"


class CrossEncoderReranker:
  """Scores (query, text) pairs with a BertForSequenceClassification checkpoint."""

  def __init__(self, logits_fn, activation: str, name: str):
    self._logits_fn = logits_fn
    self.activation = activation
    self.name = name

  @classmethod
  def from_pretrained(cls, path: str | os.PathLike, backend: str = "jax", max_length: int = 512,
                      activation: str = "auto") -> "CrossEncoderReranker":
    """Loads a folder with config.json, *.safetensors (bert.* + classifier.*) and a tokenizer."""
    if backend not in BACKENDS:
      raise ValueError(f"backend={backend!r}: choose one of {BACKENDS}")
    if activation not in ACTIVATIONS:
      raise ValueError(f"activation={activation!r}: choose one of {ACTIVATIONS}")
    folder = resolve_model_folder(path)
    config = bert.load_config(folder)
    if activation == "auto":
      activation = _configured_activation(config)
    max_length = min(max_length, config.get("max_position_embeddings", 512))

    if backend == "sentence-transformers":
      import torch
      from sentence_transformers import CrossEncoder
      model = CrossEncoder(str(folder), device="cpu", max_length=max_length,
                           activation_fn=torch.nn.Identity())

      def logits_st(queries, texts, batch_size, show_progress):
        out = model.predict(list(zip(queries, texts)), batch_size=batch_size,
                            show_progress_bar=show_progress, convert_to_numpy=True)
        return np.asarray(out, np.float32).reshape(len(queries), -1)
      return cls(logits_st, activation, str(folder))

    params = bert.load_params(folder, config)
    if "classifier" not in params:
      raise ValueError(f"{folder}: no classifier.* weights; not a BertForSequenceClassification checkpoint")
    tokenizer = load_tokenizer(folder)

    @jax.jit
    def logits(params, input_ids, mask, type_ids):
      hidden = bert.encode(params, input_ids, mask, type_ids, num_heads=config["num_attention_heads"],
                           eps=config.get("layer_norm_eps", 1e-12))
      return bert.classify(params, hidden)

    def logits_jax(queries, texts, batch_size, show_progress):
      out = run_batched(functools.partial(logits, params), tokenizer, queries, texts,
                        batch_size=batch_size, max_length=max_length, show_progress=show_progress,
                        desc="rerank")
      return out.reshape(len(queries), -1).astype(np.float32)
    return cls(logits_jax, activation, str(folder))

  def score(self, query: str, texts: Sequence[str], batch_size: int = 32,
            show_progress: bool = False) -> np.ndarray:
    """float32 [N] for one-label models (after the activation), [N, L] otherwise."""
    if not isinstance(query, str):
      raise TypeError(f"query is {type(query).__name__}, expected str")
    texts = list(texts)
    if not texts:
      return np.zeros((0,), np.float32)
    out = self._logits_fn([query] * len(texts), texts, batch_size, show_progress)
    if self.activation == "sigmoid":
      out = 1.0 / (1.0 + np.exp(-out))
    return out[:, 0] if out.shape[1] == 1 else out

  def rerank(self, query: str, hits: Sequence, top_n: int | None = None, batch_size: int = 32) -> list:
    """Rescores a recalled pool of hits (objects with .text, optional .title) and keeps the best top_n.

    Returns copies of the hits with `score` replaced by the cross-encoder score, best first.
    """
    hits = list(hits)
    if not hits:
      return []
    texts = [(f"{h.title} {h.text}" if getattr(h, "title", "") else h.text) for h in hits]
    scores = self.score(query, texts, batch_size=batch_size)
    if scores.ndim != 1:
      raise ValueError("rerank needs a one-label cross-encoder (score returned several columns)")
    order = np.argsort(-scores, kind="stable")[:top_n]
    return [dataclasses.replace(hits[i], score=float(scores[i])) for i in order]
