"""LoRA adapters: init, no-op at init, LoRA-only training, remat parity, merge, rsLoRA scale, bad input."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fineflax.lora import (LoraConfig, check_lora, init_lora, lora_scale, lora_value_and_grad,
                           merge_lora, resolve_targets)
from fineflax.models import ModelConfig, forward, init_params
from fineflax.quant import NF4Tensor
from fineflax.models.quantize import quantize_params

CFG = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16, attention_bias=True)
LCFG = LoraConfig(r=4, alpha=8.0)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 12)))


@pytest.fixture(scope="module")
def params():
  return init_params(CFG, jax.random.key(0))


@pytest.fixture(scope="module")
def qparams(params):
  return quantize_params(params)


def _randomize_b(lora, seed=1, std=0.05):
  keys = iter(jax.random.split(jax.random.key(seed), len(lora)))
  return {n: {"a": ab["a"], "b": std * jax.random.normal(next(keys), ab["b"].shape)} for n, ab in lora.items()}


def _loss(lora, base, tokens, remat="none", dropout=0.0, rng=None):
  logits = forward(base, CFG, tokens[:, :-1], lora=lora, lora_scale=lora_scale(LCFG), remat=remat,
                   lora_dropout=dropout, dropout_rng=rng)
  return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def test_init_shapes_bounds_and_noop(params):
  lora = init_lora(params, CFG, LCFG, jax.random.key(1))
  assert sorted(lora) == sorted(["q", "k", "v", "o", "gate", "up", "down"])
  assert lora["q"]["a"].shape == (2, 64, 4) and lora["k"]["b"].shape == (2, 4, 32)
  assert lora["down"]["a"].shape == (2, 128, 4) and lora["down"]["b"].shape == (2, 4, 64)
  for name, ab in lora.items():
    bound = 1 / math.sqrt(ab["a"].shape[1])
    a = np.asarray(ab["a"])
    assert a.dtype == np.float32 and np.abs(a).max() <= bound and np.abs(a).max() > 0.8 * bound
    assert not np.any(np.asarray(ab["b"]))
  fwd = jax.jit(forward, static_argnums=1, static_argnames="lora_scale")
  np.testing.assert_array_equal(np.asarray(fwd(params, CFG, TOKENS, lora=lora, lora_scale=2.0)),
                                np.asarray(fwd(params, CFG, TOKENS)))


def test_sgd_steps_change_only_lora(qparams):
  lora = init_lora(qparams, CFG, LCFG, jax.random.key(1))
  base_before = jax.tree_util.tree_map(np.asarray, qparams)
  opt = optax.sgd(0.5)
  state = opt.init(lora)
  grad_fn = jax.jit(lora_value_and_grad(_loss))

  losses, new = [], lora
  for _ in range(3):
    loss, grads = grad_fn(new, qparams, TOKENS)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(lora)
    updates, state = opt.update(grads, state)
    new = optax.apply_updates(new, updates)
    losses.append(float(loss))
  assert losses[-1] < losses[0]
  for name in lora:
    assert not np.array_equal(np.asarray(new[name]["a"]), np.asarray(lora[name]["a"]))
    assert not np.array_equal(np.asarray(new[name]["b"]), np.asarray(lora[name]["b"]))
  jax.tree_util.tree_map(np.testing.assert_array_equal, base_before, jax.tree_util.tree_map(np.asarray, qparams))


def test_remat_policies_give_equal_gradients(params):
  lora = _randomize_b(init_lora(params, CFG, LCFG, jax.random.key(2)))
  grads = {}
  for remat in ("none", "full", "dots"):
    fn = jax.jit(lora_value_and_grad(lambda l, b, t: _loss(l, b, t, remat=remat)))
    grads[remat] = fn(lora, params, TOKENS)
  for remat in ("full", "dots"):
    np.testing.assert_allclose(grads[remat][0], grads["none"][0], rtol=1e-6)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-7),
                           grads[remat][1], grads["none"][1])
  assert float(jnp.abs(grads["none"][1]["q"]["a"]).max()) > 0


def test_dropout_changes_adapter_path_only_with_a_key(params):
  lora = _randomize_b(init_lora(params, CFG, LCFG, jax.random.key(3)))
  f = jax.jit(_loss, static_argnums=(3, 4))
  plain = f(lora, params, TOKENS, "none", 0.0, None)
  d1 = f(lora, params, TOKENS, "none", 0.5, jax.random.key(7))
  d2 = f(lora, params, TOKENS, "none", 0.5, jax.random.key(7))
  assert float(d1) == float(d2) and abs(float(d1) - float(plain)) > 1e-6


def test_merge_equals_adapter_forward(params, qparams):
  lora = _randomize_b(init_lora(params, CFG, LCFG, jax.random.key(4)))
  fwd = jax.jit(forward, static_argnums=1, static_argnames="lora_scale")
  s = lora_scale(LCFG)
  want = fwd(params, CFG, TOKENS, lora=lora, lora_scale=s)
  merged = merge_lora(params, lora, LCFG)
  assert merged["layers"]["q"]["kernel"].dtype == params["layers"]["q"]["kernel"].dtype
  np.testing.assert_allclose(np.asarray(fwd(merged, CFG, TOKENS)), np.asarray(want), atol=2e-5)
  # quantised base: dequantise + merge equals the adapter forward over the NF4 base
  want_q = fwd(qparams, CFG, TOKENS, lora=lora, lora_scale=s)
  merged_q = merge_lora(qparams, lora, LCFG)
  assert not isinstance(merged_q["layers"]["q"]["kernel"], NF4Tensor)
  np.testing.assert_allclose(np.asarray(fwd(merged_q, CFG, TOKENS)), np.asarray(want_q), atol=2e-5)
  requant = merge_lora(qparams, lora, LCFG, requantize=True)
  assert isinstance(requant["layers"]["q"]["kernel"], NF4Tensor)
  assert requant["layers"]["q"]["kernel"].double_quant
  err = float(jnp.abs(fwd(requant, CFG, TOKENS) - want_q).max())
  assert 0 < err < 0.5


def test_scale_and_target_patterns():
  assert lora_scale(LoraConfig(r=16, alpha=32)) == 2.0
  assert lora_scale(LoraConfig(r=16, alpha=32, use_rslora=True)) == 8.0
  assert resolve_targets(["q_proj", "v*"]) == ("q", "v")
  assert resolve_targets(["all-linear"]) == ("q", "k", "v", "o", "gate", "up", "down")
  assert LoraConfig.from_mapping({"r": 8, "alpha": 16, "targets": ("q",), "rslora": True}) == \
      LoraConfig(r=8, alpha=16.0, target_modules=("q",), use_rslora=True)


def test_bad_input(params):
  # (Phi-3's fused "qkv_proj" is a valid target: it selects q, k and v)
  with pytest.raises(ValueError, match=r"'c_attn' matches no linear layer; available: \['q', 'k', 'v', 'o', "
                                        r"'gate', 'up', 'down'\]"):
    init_lora(params, CFG, LoraConfig(target_modules=("q", "c_attn")), jax.random.key(0))
  with pytest.raises(ValueError, match="rank must be a positive integer"):
    LoraConfig(r=0)
  other = ModelConfig(**{**CFG.__dict__, "intermediate_size": 96})
  with pytest.raises(ValueError, match=r"params\['layers'\]\['gate'\]\['kernel'\] has shape \(2, 64, 128\); "
                                        r"the model config expects \(L, in, out\) = \(2, 64, 96\)"):
    init_lora(params, other, LCFG, jax.random.key(0))
  lora = init_lora(params, CFG, LCFG, jax.random.key(0))
  bad = {**lora, "q": {"a": lora["q"]["a"], "b": jnp.zeros((2, 4, 65))}}
  with pytest.raises(ValueError, match=r"lora\['q'\]\['b'\] has shape \(2, 4, 65\); expected .* \(2, 4, 64\)"):
    check_lora(bad, CFG, LCFG)
  with pytest.raises(ValueError, match=r"\['a'\] has shape \(2, 64, 4\); expected \(L, in, r\) = \(2, 64, 8\)"):
    check_lora(lora, CFG, LoraConfig(r=8))
  with pytest.raises(ValueError, match="unknown linear 'qkv'"):
    check_lora({"qkv": lora["q"]}, CFG)
  with pytest.raises(ValueError, match="does not fit"):
    merge_lora(params, {"q": lora["k"]}, LCFG)
