"""Logits parity of the fineflax decoder with transformers (PyTorch, f32) for every supported family."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from fineflax.testing.hf_models import make_hf_model
from fineflax.models import forward, load, state_dict_from_params

pytestmark = pytest.mark.fast

FAMILIES = ["llama", "llama3", "smollm2", "mistral", "qwen2", "qwen3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(family, tmp_path):
  model = make_hf_model(family, tmp_path)
  params, config, _ = load(tmp_path, with_tokenizer=False)
  rng = np.random.RandomState(1)
  tokens = rng.randint(0, config.vocab_size, (3, 24))
  mask = np.ones_like(tokens)
  mask[1, :5] = 0  # left padding
  mask[2, :11] = 0
  # positions far from 0 exercise rope scaling (llama3's low-frequency band)
  with torch.no_grad():
    ref = model(torch.tensor(tokens), attention_mask=torch.tensor(mask)).logits.numpy()
  out = np.asarray(jax.jit(lambda p, t, m: forward(p, config, t, attention_mask=m))(
      params, jnp.asarray(tokens), jnp.asarray(mask)))
  for b in range(3):
    valid = mask[b].astype(bool)
    np.testing.assert_allclose(out[b, valid], ref[b, valid], atol=1e-4, rtol=0)


def test_long_positions_llama3_rope(tmp_path):
  model = make_hf_model("llama3", tmp_path)
  params, config, _ = load(tmp_path, with_tokenizer=False)
  tokens = np.random.RandomState(2).randint(0, config.vocab_size, (1, 300))
  with torch.no_grad():
    ref = model(torch.tensor(tokens)).logits.numpy()
  out = np.asarray(forward(params, config, jnp.asarray(tokens)))
  np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)


def test_state_dict_round_trip(tmp_path):
  model = make_hf_model("qwen2", tmp_path)
  params, config, _ = load(tmp_path, with_tokenizer=False)
  sd = state_dict_from_params(params, config)
  ref = {k: v.numpy() for k, v in model.state_dict().items()}
  assert set(sd) == set(ref)
  for k in ref:
    np.testing.assert_array_equal(sd[k], ref[k], err_msg=k)


def test_sharded_checkpoint(tmp_path):
  model = make_hf_model("llama", tmp_path / "one")
  model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
  assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
  a, _, _ = load(tmp_path / "one", with_tokenizer=False)
  b, _, _ = load(tmp_path / "sharded", with_tokenizer=False)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_bf16_checkpoint_loads(tmp_path):
  model = make_hf_model("llama", tmp_path)
  model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
  params, config, _ = load(tmp_path / "bf16", dtype=jnp.bfloat16, with_tokenizer=False)
  assert params["embed"].dtype == jnp.bfloat16
  ref = model.model.embed_tokens.weight.detach().float().numpy()
  np.testing.assert_array_equal(np.asarray(params["embed"], np.float32), ref)


# The real SmolLM2 GGUF against transformers' own GGUF loader (logits and greedy tokens):
# tests/test_sampling_smollm2.py::test_smollm2_gguf_matches_transformers_loading_the_gguf (one ~25 s load for both).


def test_quantised_load_equals_load_then_quantize(tmp_path):
  """load(quant="nf4") quantises the host kernels one layer at a time: same tensors as quantising the
  loaded device params; the linears outside quant_targets and every other leaf stay dense and equal."""
  from fineflax.quant import NF4Tensor
  from fineflax.models.quantize import quantize_params
  make_hf_model("llama", tmp_path)
  dense, config, _ = load(tmp_path, with_tokenizer=False)
  got, config2, _ = load(tmp_path, with_tokenizer=False, quant="nf4", quant_targets=("q_proj", "down"))
  want = quantize_params(dense, targets=("q", "down"), kind="nf4")
  assert config2 == config
  assert isinstance(got["layers"]["q"]["kernel"], NF4Tensor) and not hasattr(got["layers"]["k"]["kernel"], "codes")
  assert jax.tree.structure(got) == jax.tree.structure(want)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6), got, want)
