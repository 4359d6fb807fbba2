"""Cross-encoder fine-tuning in JAX (optax) on retrieval/bert.py's pure-function BERT, and saving in
sentence-transformers' CrossEncoder format (a BertForSequenceClassification folder).

Model: s(q, d) = tanh(BERT([CLS] q [SEP] d [SEP])_CLS Wp + bp) Wc + bc   (one logit; bert.classify)
Loss (listwise, one positive and n hard negatives per group, as in a softmax over a BM25 pool):
  L = -1/G sum_g log softmax(s_g0, s_g1, ..., s_gn)_0
Training code (needs optax), kept beside the reranker it trains: the rest of retrieval/ never imports it
(retrieval/rerank.py loads the saved folder), and it imports nothing of fineflax.
"""
from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from safetensors.numpy import save_file

from retrieval import bert
from retrieval.atomic import atomic_dir

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def add_head(params: dict, hidden: int, seed: int = 0, std: float = 0.02) -> dict:
  """params with a pooler (kept if the checkpoint has one) and a one-logit classifier, N(0, std) init."""
  rng = np.random.default_rng(seed)
  out = dict(params)
  if "pooler" not in out:
    out["pooler"] = {"w": jnp.asarray(rng.normal(0, std, (hidden, hidden)), jnp.float32),
                     "b": jnp.zeros((hidden,), jnp.float32)}
  out["classifier"] = {"w": jnp.asarray(rng.normal(0, std, (hidden, 1)), jnp.float32),
                       "b": jnp.zeros((1,), jnp.float32)}
  return out


def scores(params: dict, batch: dict, *, num_heads: int, eps: float = 1e-12) -> jax.Array:
  """Logits [N] for tokenised pairs: batch = {input_ids, attention_mask, token_type_ids} [N, T]."""
  hidden = bert.encode(params, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                       num_heads=num_heads, eps=eps)
  return bert.classify(params, hidden)[:, 0]


def listwise_loss(params: dict, batch: dict, group: int, *, num_heads: int, eps: float = 1e-12) -> jax.Array:
  """-mean_g log softmax(scores of group g)[0]; rows are [G * group] with each group's positive first."""
  s = scores(params, batch, num_heads=num_heads, eps=eps).reshape(-1, group)
  return -jnp.mean(jax.nn.log_softmax(s, axis=-1)[:, 0])


def make_train_step(optimizer: optax.GradientTransformation, group: int, num_heads: int, eps: float = 1e-12):
  """jit step(params, opt_state, batch) -> (params, opt_state, loss)."""

  @jax.jit
  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(listwise_loss)(params, batch, group, num_heads=num_heads, eps=eps)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  return step


def tokenize_pairs(tokenizer, queries: list[str], texts: list[str], max_length: int) -> dict[str, np.ndarray]:
  """Padded to the longest pair (at most max_length), as CrossEncoder.predict tokenises."""
  enc = tokenizer(queries, texts, truncation=True, max_length=max_length, padding=True, return_tensors="np",
                  return_token_type_ids=True)
  return {k: np.asarray(enc[k], np.int32) for k in ("input_ids", "attention_mask", "token_type_ids")}


def _linear(p: dict) -> tuple[np.ndarray, np.ndarray]:
  return np.ascontiguousarray(np.asarray(p["w"], np.float32).T), np.asarray(p["b"], np.float32)


def hf_tensors(params: dict) -> dict[str, np.ndarray]:
  """The inverse of bert.load_params: BertForSequenceClassification state-dict names, (out, in) weights."""
  t: dict[str, np.ndarray] = {}

  def put(name: str, p: dict) -> None:
    t[f"{name}.weight"], t[f"{name}.bias"] = _linear(p)

  def put_norm(name: str, p: dict) -> None:
    t[f"{name}.weight"], t[f"{name}.bias"] = np.asarray(p["scale"], np.float32), np.asarray(p["bias"], np.float32)

  e = params["embeddings"]
  t["bert.embeddings.word_embeddings.weight"] = np.asarray(e["word"], np.float32)
  t["bert.embeddings.position_embeddings.weight"] = np.asarray(e["position"], np.float32)
  t["bert.embeddings.token_type_embeddings.weight"] = np.asarray(e["token_type"], np.float32)
  put_norm("bert.embeddings.LayerNorm", e["ln"])
  for i, layer in enumerate(params["layers"]):
    p = f"bert.encoder.layer.{i}"
    put(f"{p}.attention.self.query", layer["q"])
    put(f"{p}.attention.self.key", layer["k"])
    put(f"{p}.attention.self.value", layer["v"])
    put(f"{p}.attention.output.dense", layer["attn_out"])
    put_norm(f"{p}.attention.output.LayerNorm", layer["attn_ln"])
    put(f"{p}.intermediate.dense", layer["ffn_in"])
    put(f"{p}.output.dense", layer["ffn_out"])
    put_norm(f"{p}.output.LayerNorm", layer["ffn_ln"])
  put("bert.pooler.dense", params["pooler"])
  put("classifier", params["classifier"])
  return t


def save_cross_encoder(params: dict, base_folder: str | pathlib.Path, out: str | pathlib.Path,
                       max_length: int = 512, meta: dict[str, Any] | None = None) -> pathlib.Path:
  """Writes a folder that sentence_transformers.CrossEncoder and retrieval.rerank.CrossEncoderReranker load:
  config.json (BertForSequenceClassification, one label, sigmoid activation), model.safetensors, the
  tokenizer files of `base_folder`. Atomic (temporary folder + rename)."""
  base_folder = pathlib.Path(base_folder)
  config = json.loads((base_folder / "config.json").read_text())
  config.update(architectures=["BertForSequenceClassification"], num_labels=1, id2label={"0": "LABEL_0"},
                label2id={"LABEL_0": 0},
                sentence_transformers={"activation_fn": "torch.nn.modules.activation.Sigmoid"})
  config.pop("_name_or_path", None)
  with atomic_dir(out) as tmp:
    save_file(hf_tensors(params), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
      if (base_folder / name).is_file():
        shutil.copy(base_folder / name, tmp / name)
    if (tmp / "tokenizer_config.json").is_file():  # CrossEncoder reads its max length from here
      tc = json.loads((tmp / "tokenizer_config.json").read_text())
      tc["model_max_length"] = max_length
      (tmp / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    if meta:
      (tmp / "training.json").write_text(json.dumps(meta, indent=2))
  return pathlib.Path(out)
