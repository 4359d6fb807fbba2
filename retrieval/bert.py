"""A BERT encoder as pure JAX functions over a params dict, loaded from a Hugging Face folder.

Layout of `params` (linear weights stored (in, out), so y = x @ w + b):
  embeddings: {word, position, token_type: [V|P|2, H], ln: {scale, bias}}
  layers: list of {q, k, v, attn_out, ffn_in, ffn_out: {w, b}, attn_ln, ffn_ln: {scale, bias}}
  pooler: {w, b}          (only BertForSequenceClassification checkpoints)
  classifier: {w, b}      (only BertForSequenceClassification checkpoints)

Forward (post-LN BERT, exact-erf GELU, as transformers' BertModel):
  h = LN(word[ids] + position[0..T) + token_type[tt])
  per layer: a = LN(h + MHA(h, mask) Wo); h = LN(a + GELU(a W1) W2)
  mean_pool(h, m) = sum_t m_t h_t / max(sum_t m_t, 1e-9);  classify(h) = tanh(h[:, 0] Wp) Wc
"""
from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file

Params = dict[str, Any]


def _linear(tensors: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
  return {"w": np.ascontiguousarray(tensors[f"{name}.weight"].T), "b": tensors[f"{name}.bias"]}


def _norm(tensors: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
  # Old checkpoints name LayerNorm parameters gamma/beta.
  scale = tensors.get(f"{name}.weight", tensors.get(f"{name}.gamma"))
  bias = tensors.get(f"{name}.bias", tensors.get(f"{name}.beta"))
  if scale is None or bias is None:
    raise KeyError(f"LayerNorm {name!r} not found in checkpoint")
  return {"scale": scale, "bias": bias}


def load_config(folder: str | pathlib.Path) -> dict[str, Any]:
  """Reads config.json and checks the fields the encoder needs."""
  path = pathlib.Path(folder) / "config.json"
  if not path.is_file():
    raise FileNotFoundError(f"{path}: no config.json in model folder")
  config = json.loads(path.read_text())
  for field in ("hidden_size", "num_attention_heads", "num_hidden_layers"):
    if field not in config:
      raise ValueError(f"{path}: missing field {field!r}")
  if config.get("hidden_act", "gelu") != "gelu":
    raise ValueError(f"{path}: hidden_act={config['hidden_act']!r}; only 'gelu' (exact erf) is supported")
  if config.get("position_embedding_type", "absolute") != "absolute":
    raise ValueError(f"{path}: position_embedding_type={config['position_embedding_type']!r} not supported")
  return config


def load_params(folder: str | pathlib.Path, config: dict[str, Any]) -> Params:
  """Reads *.safetensors in `folder` (BertModel or BertForSequenceClassification keys) as NumPy."""
  folder = pathlib.Path(folder)
  files = sorted(folder.glob("*.safetensors"))
  if not files:
    raise FileNotFoundError(f"{folder}: no *.safetensors file (convert pytorch_model.bin first)")
  tensors: dict[str, np.ndarray] = {}
  for f in files:
    tensors.update(load_file(f))
  tensors = {k.removeprefix("bert."): v.astype(np.float32) for k, v in tensors.items()}
  e = "embeddings"
  params: Params = {
      "embeddings": {
          "word": tensors[f"{e}.word_embeddings.weight"],
          "position": tensors[f"{e}.position_embeddings.weight"],
          "token_type": tensors[f"{e}.token_type_embeddings.weight"],
          "ln": _norm(tensors, f"{e}.LayerNorm"),
      },
      "layers": [],
  }
  for i in range(config["num_hidden_layers"]):
    p = f"encoder.layer.{i}"
    params["layers"].append({
        "q": _linear(tensors, f"{p}.attention.self.query"),
        "k": _linear(tensors, f"{p}.attention.self.key"),
        "v": _linear(tensors, f"{p}.attention.self.value"),
        "attn_out": _linear(tensors, f"{p}.attention.output.dense"),
        "attn_ln": _norm(tensors, f"{p}.attention.output.LayerNorm"),
        "ffn_in": _linear(tensors, f"{p}.intermediate.dense"),
        "ffn_out": _linear(tensors, f"{p}.output.dense"),
        "ffn_ln": _norm(tensors, f"{p}.output.LayerNorm"),
    })
  if "pooler.dense.weight" in tensors:
    params["pooler"] = _linear(tensors, "pooler.dense")
  if "classifier.weight" in tensors:
    params["classifier"] = _linear(tensors, "classifier")
  return jax.tree.map(jnp.asarray, params)


def layer_norm(x: jax.Array, p: dict[str, jax.Array], eps: float) -> jax.Array:
  """(x - mean) / sqrt(var + eps) * scale + bias over the last axis."""
  mean = x.mean(-1, keepdims=True)
  var = jnp.square(x - mean).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def dense(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
  return x @ p["w"] + p["b"]


def encode(params: Params, input_ids: jax.Array, attention_mask: jax.Array, token_type_ids: jax.Array,
           *, num_heads: int, eps: float = 1e-12) -> jax.Array:
  """Last hidden states [B, T, H] of BERT for int ids [B, T] with a 0/1 attention mask [B, T]."""
  emb = params["embeddings"]
  t = input_ids.shape[1]
  h = emb["word"][input_ids] + emb["position"][:t][None] + emb["token_type"][token_type_ids]
  h = layer_norm(h, emb["ln"], eps)
  b, _, width = h.shape
  head_dim = width // num_heads
  bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, jnp.finfo(h.dtype).min)
  split = lambda x: x.reshape(b, t, num_heads, head_dim).transpose(0, 2, 1, 3)
  for layer in params["layers"]:
    q, k, v = (split(dense(h, layer[n])) for n in ("q", "k", "v"))
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(head_dim) + bias
    ctx = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(logits, axis=-1), v)
    ctx = ctx.transpose(0, 2, 1, 3).reshape(b, t, width)
    h = layer_norm(h + dense(ctx, layer["attn_out"]), layer["attn_ln"], eps)
    ffn = dense(jax.nn.gelu(dense(h, layer["ffn_in"]), approximate=False), layer["ffn_out"])
    h = layer_norm(h + ffn, layer["ffn_ln"], eps)
  return h


def mean_pool(hidden: jax.Array, attention_mask: jax.Array) -> jax.Array:
  """sum_t m_t h_t / max(sum_t m_t, 1e-9): sentence-transformers' mean pooling."""
  m = attention_mask[..., None].astype(hidden.dtype)
  return (hidden * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)


def l2_normalize(x: jax.Array) -> jax.Array:
  """x / max(||x||, 1e-12), as torch.nn.functional.normalize."""
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def classify(params: Params, hidden: jax.Array) -> jax.Array:
  """BertForSequenceClassification head: logits [B, L] = tanh(h_CLS Wp + bp) Wc + bc."""
  if "pooler" not in params or "classifier" not in params:
    raise ValueError("checkpoint has no pooler/classifier weights (not a BertForSequenceClassification)")
  return dense(jnp.tanh(dense(hidden[:, 0], params["pooler"])), params["classifier"])
