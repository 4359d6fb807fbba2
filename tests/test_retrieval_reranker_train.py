"""Cross-encoder training (retrieval/cross_encoder_train.py) on a tiny random BERT: the loss falls, the
gradient matches finite differences, and the saved folder scores like sentence-transformers' CrossEncoder."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from retrieval import cross_encoder_train as ce
from retrieval import bert
from retrieval.hf_model import resolve_model_folder
from retrieval.rerank import CrossEncoderReranker

os.environ.setdefault("HF_HUB_OFFLINE", "1")
QUERY = "how do proteins fold?"
TEXTS = ["Hydrophobic collapse drives protein folding.", "Insulin regulates glucose uptake.",
         "Chaperones help proteins fold correctly in the cell.", "The gut microbiome shapes immunity.",
         "Amyloid fibrils build up in Alzheimer brains.", "T cells drive adaptive immunity.",
         "Folding funnels describe the energy landscape of proteins.", "Mitochondria make ATP."]


def _random_bert(cfg: dict, seed: int = 0, std: float = 0.2) -> dict:
  """retrieval.bert's params layout with N(0, std) weights (LayerNorm scale 1, bias 0)."""
  rng = np.random.default_rng(seed)
  h, f = cfg["hidden_size"], cfg["intermediate_size"]
  lin = lambda i, o: {"w": jnp.asarray(rng.normal(0, std, (i, o)), jnp.float32),
                      "b": jnp.asarray(rng.normal(0, std, (o,)), jnp.float32)}
  ln = lambda: {"scale": jnp.ones((h,), jnp.float32), "bias": jnp.zeros((h,), jnp.float32)}
  emb = lambda n: jnp.asarray(rng.normal(0, std, (n, h)), jnp.float32)
  return {"embeddings": {"word": emb(cfg["vocab_size"]), "position": emb(cfg["max_position_embeddings"]),
                         "token_type": emb(2), "ln": ln()},
          "layers": [{"q": lin(h, h), "k": lin(h, h), "v": lin(h, h), "attn_out": lin(h, h), "attn_ln": ln(),
                      "ffn_in": lin(h, f), "ffn_out": lin(f, h), "ffn_ln": ln()} for _ in range(2)]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """A random 2-layer BERT (no head; no torch needed) with MiniLM's tokenizer: what add_head starts from."""
  import json
  import shutil
  from transformers import AutoTokenizer
  base = resolve_model_folder("all-MiniLM-L6-v2")
  folder = tmp_path_factory.mktemp("tiny-bert")
  cfg = dict(json.loads((base / "config.json").read_text()), hidden_size=32, num_hidden_layers=2,
             num_attention_heads=4, intermediate_size=64, max_position_embeddings=128)
  (folder / "config.json").write_text(json.dumps(cfg))
  for name in ce.TOKENIZER_FILES:
    shutil.copy(base / name, folder / name)
  params = ce.add_head(_random_bert(cfg), cfg["hidden_size"], seed=0, std=0.3)
  batch = ce.tokenize_pairs(AutoTokenizer.from_pretrained(str(folder)), [QUERY] * len(TEXTS), TEXTS, 64)
  return folder, cfg, params, batch


def test_training_step_lowers_the_loss(tiny):
  _, cfg, params, batch = tiny
  optimizer = optax.adam(3e-3)
  step = ce.make_train_step(optimizer, 4, cfg["num_attention_heads"])
  state = optimizer.init(params)
  losses = []
  for _ in range(12):
    params, state, loss = step(params, state, batch)
    losses.append(float(loss))
  assert losses[0] == pytest.approx(float(ce.listwise_loss(tiny[2], batch, 4, num_heads=4)), rel=1e-6)
  assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.fast
def test_gradient_matches_finite_differences(tiny):
  _, cfg, params, batch = tiny
  loss = jax.jit(lambda p: ce.listwise_loss(p, batch, 4, num_heads=cfg["num_attention_heads"]))
  grads = jax.jit(jax.grad(loss))(params)
  assert abs(float(grads["classifier"]["b"][0])) < 1e-6  # a shared bias cannot change a softmax
  rng = np.random.default_rng(1)
  for path in (("classifier", "w"), ("pooler", "w"), ("layers", 1, "ffn_in", "w")):
    leaf = params
    for key in path:
      leaf = leaf[key]
    v = jnp.asarray(rng.standard_normal(leaf.shape), jnp.float32)

    def shifted(eps):
      p = jax.tree.map(lambda x: x, params)
      node = p
      for key in path[:-1]:
        node = node[key]
      node[path[-1]] = leaf + eps * v
      return float(loss(p))
    g = grads
    for key in path:
      g = g[key]
    eps = 2e-3
    numeric = (shifted(eps) - shifted(-eps)) / (2 * eps)
    assert float(jnp.vdot(g, v)) == pytest.approx(numeric, rel=2e-2, abs=1e-4), path


def test_saved_model_scores_like_sentence_transformers(tiny, tmp_path):
  import torch
  from sentence_transformers import CrossEncoder
  folder, cfg, params, batch = tiny
  rng = np.random.default_rng(2)  # move every weight off what add_head/_random_bert made
  params = jax.tree.map(lambda x: x + jnp.asarray(rng.normal(0, 0.05, x.shape), jnp.float32), params)
  ours = np.asarray(jax.jit(lambda p, b: ce.scores(p, b, num_heads=4))(params, batch))
  out = ce.save_cross_encoder(params, folder, tmp_path / "ce", max_length=64)
  reloaded = bert.load_params(out, bert.load_config(out))
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reloaded)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  reference = CrossEncoder(str(out), device="cpu")
  pairs = [(QUERY, t) for t in TEXTS]
  logits = reference.predict(pairs, activation_fn=torch.nn.Identity())
  np.testing.assert_allclose(ours, logits, atol=1e-4)
  assert np.ptp(logits) > 0.1  # not a comparison of constants
  np.testing.assert_allclose(reference.predict(pairs), 1 / (1 + np.exp(-logits)), atol=1e-6)  # sigmoid configured
  reranker = CrossEncoderReranker.from_pretrained(out)
  assert reranker.activation == "sigmoid"
  np.testing.assert_allclose(reranker.score(QUERY, TEXTS), reference.predict(pairs), atol=1e-4)
