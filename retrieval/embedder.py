"""Sentence embeddings: BERT encoder + mean pooling + L2 normalisation (sentence-transformers recipe).

  e(text) = normalize(mean_pool(BERT(tokens(text)[:max_length]), mask))   -> float32 [d]

Backends: "jax" (retrieval.bert, jit-compiled) and "sentence-transformers" (the reference).
"""
from __future__ import annotations

import functools
import json
import os
from typing import Sequence

import jax
import numpy as np

from retrieval import bert
from retrieval.hf_model import load_tokenizer, resolve_model_folder, run_batched

BACKENDS = ("jax", "sentence-transformers")


class Embedder:
  """Encodes texts to L2-normalised float32 vectors. Build with `Embedder.from_pretrained`."""

  def __init__(self, encode_fn, dim: int, name: str):
    self._encode_fn = encode_fn
    self.dim = dim
    self.name = name

  @classmethod
  def from_pretrained(cls, path_or_alias: str | os.PathLike = "all-MiniLM-L6-v2", backend: str = "jax",
                      max_length: int = 256) -> "Embedder":
    """Loads a sentence-transformers folder (config.json, *.safetensors, tokenizer) or alias."""
    if backend not in BACKENDS:
      raise ValueError(f"backend={backend!r}: choose one of {BACKENDS}")
    folder = resolve_model_folder(path_or_alias)
    config = bert.load_config(folder)
    st_config = folder / "sentence_bert_config.json"
    if st_config.is_file():
      max_length = min(max_length, json.loads(st_config.read_text()).get("max_seq_length", max_length))
    max_length = min(max_length, config.get("max_position_embeddings", 512))
    pooling = folder / "1_Pooling" / "config.json"
    if pooling.is_file() and not json.loads(pooling.read_text()).get("pooling_mode_mean_tokens", True):
      raise ValueError(f"{pooling}: only mean pooling is supported")

    if backend == "sentence-transformers":
      from sentence_transformers import SentenceTransformer
      model = SentenceTransformer(str(folder), device="cpu")
      model.max_seq_length = max_length

      def encode_st(texts, batch_size, show_progress):
        return model.encode(list(texts), batch_size=batch_size, show_progress_bar=show_progress,
                            normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)
      return cls(encode_st, config["hidden_size"], str(folder))

    params = bert.load_params(folder, config)
    tokenizer = load_tokenizer(folder)

    @jax.jit
    def embed(params, input_ids, mask, type_ids):
      hidden = bert.encode(params, input_ids, mask, type_ids, num_heads=config["num_attention_heads"],
                           eps=config.get("layer_norm_eps", 1e-12))
      return bert.l2_normalize(bert.mean_pool(hidden, mask))

    def encode_jax(texts, batch_size, show_progress):
      out = run_batched(functools.partial(embed, params), tokenizer, texts, batch_size=batch_size,
                        max_length=max_length, show_progress=show_progress, desc="encode")
      return out.reshape(len(texts), config["hidden_size"]).astype(np.float32)
    return cls(encode_jax, config["hidden_size"], str(folder))

  def encode(self, texts: Sequence[str] | str, batch_size: int = 64,
             show_progress: bool | None = None) -> np.ndarray:
    """float32 [N, dim], rows L2-normalised, in input order. One string gives [1, dim].

    show_progress=None shows a tqdm bar when there are more than 4 batches.
    """
    if isinstance(texts, str):
      texts = [texts]
    texts = list(texts)
    for i, t in enumerate(texts):
      if not isinstance(t, str):
        raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str")
    if not texts:
      return np.zeros((0, self.dim), np.float32)
    if show_progress is None:
      show_progress = len(texts) > 4 * batch_size
    return self._encode_fn(texts, batch_size, show_progress)
