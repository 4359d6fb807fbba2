"""JAX BERT models against sentence-transformers: MiniLM embeddings and a tiny random cross-encoder."""
import os

import numpy as np
import pytest

from retrieval.documents import Hit
from retrieval.embedder import Embedder
from retrieval.hf_model import resolve_model_folder
from retrieval.rerank import CrossEncoderReranker

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SENTENCES = [
    "Hi.",
    "x",
    "The quick brown fox jumps over the lazy dog.",
    "Amyloid-beta oligomers impair synaptic plasticity in the hippocampus of transgenic mice.",
    "What is the capital of France?",
    "BM25 ranks documents by term frequency, inverse document frequency and document length.",
    "Ünïcödé täxt wïth äccents and emoji 🚀 should tokenise fine.",
    "1234 5678 90",
    "A" * 50,
    "Retrieval-augmented generation " * 10,
    "Long documents are truncated to the model's maximum length. " * 60,  # > 256 tokens
    "",
]


def test_minilm_matches_sentence_transformers():
  from sentence_transformers import SentenceTransformer
  folder = resolve_model_folder("all-MiniLM-L6-v2")
  reference = SentenceTransformer(str(folder), device="cpu").encode(SENTENCES, normalize_embeddings=True)
  embedder = Embedder.from_pretrained("all-MiniLM-L6-v2")
  ours = embedder.encode(SENTENCES, batch_size=4)  # several length/batch buckets
  assert ours.dtype == np.float32 and ours.shape == (len(SENTENCES), embedder.dim) == (12, 384)
  cosine = (ours * reference).sum(1) / np.linalg.norm(reference, axis=1)
  assert cosine.min() >= 0.9999, cosine
  np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(embedder.encode(SENTENCES[3])[0], ours[3], atol=1e-5)  # batch-independent
  assert embedder.encode([]).shape == (0, 384)


@pytest.mark.fast
def test_unknown_model_is_a_clear_error():
  with pytest.raises(FileNotFoundError, match="not-a-model"):
    Embedder.from_pretrained("not-a-model")
  with pytest.raises(ValueError, match="backend='onnx'"):
    Embedder.from_pretrained(backend="onnx")


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory):
  import torch
  from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification
  folder = tmp_path_factory.mktemp("tiny-ce")
  tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_folder("all-MiniLM-L6-v2")))
  config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=64, max_position_embeddings=128, num_labels=1,
                      initializer_range=0.3)
  torch.manual_seed(0)
  model = BertForSequenceClassification(config)
  model.save_pretrained(folder)
  tokenizer.save_pretrained(folder)
  return folder


def test_cross_encoder_matches_sentence_transformers(tiny_cross_encoder):
  import torch
  from sentence_transformers import CrossEncoder
  query = "how do proteins fold?"
  texts = SENTENCES[2:8] + [SENTENCES[10]]
  reference = CrossEncoder(str(tiny_cross_encoder), device="cpu")
  expected_prob = reference.predict([(query, t) for t in texts])
  expected_logit = reference.predict([(query, t) for t in texts], activation_fn=torch.nn.Identity())
  ours = CrossEncoderReranker.from_pretrained(tiny_cross_encoder)
  assert ours.activation == "sigmoid"  # sentence-transformers' default for one label
  np.testing.assert_allclose(ours.score(query, texts, batch_size=3), expected_prob, atol=1e-5)
  logits = CrossEncoderReranker.from_pretrained(tiny_cross_encoder, activation="identity")
  got = logits.score(query, texts)
  np.testing.assert_allclose(got, expected_logit, rtol=1e-4, atol=1e-4)
  assert np.ptp(got) > 1e-2  # the comparison is not between constants

  pool = [Hit(str(i), 0.0, t) for i, t in enumerate(texts)]
  reranked = logits.rerank(query, pool, top_n=3)
  best = np.argsort(-got)[:3]
  assert [h.id for h in reranked] == [str(i) for i in best]
  np.testing.assert_allclose([h.score for h in reranked], got[best], rtol=1e-6)
