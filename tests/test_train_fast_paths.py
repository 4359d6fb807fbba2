"""The training step's fast paths against the plain computation on a tiny model (f32, CPU).

Reference = dense f32 logits from `forward` (masked XLA attention, segment ids honoured) and
`token_logp`: loss and LoRA gradients of every fast path must match it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.lora import LoraConfig, init_lora, lora_scale
from fineflax.models import ModelConfig, forward, forward_hidden, init_params
from fineflax.models.logprobs import token_logp
from fineflax.train.sft_step import sft_nll

MC = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=8, tie_word_embeddings=True)
LCFG = LoraConfig(r=4, alpha=8.0, target_modules=("q", "k", "v", "o", "gate", "up", "down"))


def _setup(seed=0, b=3, t=12):
  params = init_params(MC, jax.random.PRNGKey(seed), dtype=jnp.float32)
  lora = init_lora(params, MC, LCFG, jax.random.PRNGKey(seed + 1))
  # non-zero b so the adapters change the output
  lora = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(seed + 2), x.shape), lora)
  rng = np.random.default_rng(seed)
  lengths = [t, t - 3, 5]  # right padding, one sequence a row (fineflax.data without packing)
  tokens = rng.integers(0, MC.vocab_size, (b, t + 1)).astype(np.int32)
  valid = (np.arange(t)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  batch = {"tokens": tokens[:, :-1] * valid, "targets": tokens[:, 1:] * valid,
           "loss_mask": valid.astype(np.float32), "attention_mask": valid,
           "positions": (np.arange(t)[None] * valid).astype(np.int32), "segment_ids": valid.copy()}
  return params, lora, {k: jnp.asarray(v) for k, v in batch.items()}


def _dense_nll(lora, params, batch):
  logits = forward(params, MC, batch["tokens"], positions=batch["positions"],
                   attention_mask=batch["attention_mask"], segment_ids=batch["segment_ids"], lora=lora,
                   lora_scale=lora_scale(LCFG))
  return -jnp.sum(token_logp(logits, batch["targets"]) * batch["loss_mask"])


def _assert_close(fast, ref, rtol=2e-5, atol=2e-6):
  (val, g), (ref_val, g_ref) = fast, ref
  np.testing.assert_allclose(val, ref_val, rtol=rtol, atol=atol)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g), jax.tree_util.tree_leaves(g_ref)):
    np.testing.assert_allclose(a, b, rtol=rtol * 50, atol=atol * 50, err_msg=jax.tree_util.keystr(path))


def _sft(causal_prefix, remat, base=None):
  return lambda lo, p, bt: sft_nll(lo, p if base is None else base, bt, model_config=MC,
                                   lora_scale=lora_scale(LCFG), logits_chunk=5, remat=remat,
                                   causal_prefix=causal_prefix)[0]


def test_sft_nll_matches_dense_reference():
  # causal_prefix attention and the chunked loss whose gradient comes from the forward pass (remat full)
  params, lora, batch = _setup()
  vg = lambda f: jax.value_and_grad(f)(lora, params, batch)
  ref, causal = jax.jit(lambda: (vg(_dense_nll), vg(_sft(True, "full"))))()
  _assert_close(causal, ref)


def test_causal_prefix_keeps_real_tokens_and_refuses_segments():
  params, lora, batch = _setup(seed=3)
  kw = dict(positions=batch["positions"], attention_mask=batch["attention_mask"], lora=lora,
            lora_scale=lora_scale(LCFG))
  fwd = jax.jit(forward_hidden, static_argnums=1, static_argnames="causal_prefix")
  masked = fwd(params, MC, batch["tokens"], segment_ids=batch["segment_ids"], **kw)
  causal = fwd(params, MC, batch["tokens"], causal_prefix=True, **kw)
  valid = np.asarray(batch["attention_mask"], bool)
  np.testing.assert_allclose(np.asarray(causal)[valid], np.asarray(masked)[valid], rtol=1e-5, atol=1e-5)
  assert not np.allclose(np.asarray(causal)[~valid], np.asarray(masked)[~valid])  # padding may differ
  with pytest.raises(ValueError, match="causal_prefix"):
    forward_hidden(params, MC, batch["tokens"], segment_ids=batch["segment_ids"], causal_prefix=True, **kw)


def test_sft_nll_on_nf4_weights_matches_dequantised_dense_reference():
  from fineflax.quant import dequantize_params
  from fineflax.models.quantize import quantize_params
  params, lora, batch = _setup(seed=5)
  qparams = quantize_params(params)
  dense = dequantize_params(qparams, jnp.float32)  # the same weights the NF4 model computes with
  ref, fast = jax.jit(lambda: (jax.value_and_grad(_dense_nll)(lora, dense, batch),
                               jax.value_and_grad(_sft(True, "full", qparams))(lora, dense, batch)))()
  _assert_close(fast, ref)


def test_lora_values_and_gradients_equal_merged_weight_reference():
  # the decoder's adapters (q/k/v and gate/up sharing one down-projection matmul) against the same
  # model with W + scale * a @ b written into the kernels: loss and d loss / d (a, b) agree
  params, lora, batch = _setup(seed=7)
  s = lora_scale(LCFG)

  def merged_nll(lo):
    layers = dict(params["layers"])
    for name, ab in lo.items():
      kernel = layers[name]["kernel"] + s * jnp.einsum("lir,lro->lio", ab["a"], ab["b"])
      layers[name] = {**layers[name], "kernel": kernel}
    return _dense_nll(None, {**params, "layers": layers}, batch)

  ref, got = jax.jit(lambda: (jax.value_and_grad(merged_nll)(lora),
                              jax.value_and_grad(_dense_nll)(lora, params, batch)))()
  _assert_close(got, ref)
