"""Decoding a quantised base from a dense copy (`SamplerSession(dense_base=True)`, `config.rl.dense_rollouts`):
the same greedy tokens and log-probs as decoding the NF4 base itself, on both decoders, and no quantised
leaf left in the session; the unrolled layout equals that of the dequantised params."""
import jax
import jax.numpy as jnp
import numpy as np

from fineflax.models import ModelConfig, init_params
from fineflax.models.unrolled import prepare_unrolled
from fineflax.quant import dequantize_params, is_quantized
from fineflax.models.quantize import quantize_params
from fineflax.sampling import SamplerSession
from fineflax.train.run_config import config_diff

C = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=16, attention_bias=True)


def _nf4_params():
  return quantize_params(init_params(C, jax.random.PRNGKey(0)), kind="nf4")


def test_dense_base_decodes_the_same_tokens():
  """Unrolled decoder (the GPU default): same greedy tokens and log-probs from the dense copy as from NF4."""
  params = _nf4_params()
  prompts = [[1, 2, 3, 4], [5, 6]]
  out = {}
  for dense in (False, True):
    s = SamplerSession(params, C, max_total_len=12, temperature=0.0, eos_ids=(), dtype=jnp.float32,
                       impl="unrolled", dense_base=dense)
    leaves = jax.tree.leaves(s.params, is_leaf=is_quantized)
    assert any(map(is_quantized, leaves)) != dense
    s.start(prompts)
    s.decode(8)
    out[dense] = s.result(width=8)
  np.testing.assert_array_equal(np.asarray(out[True].tokens), np.asarray(out[False].tokens))
  np.testing.assert_allclose(np.asarray(out[True].logprobs), np.asarray(out[False].logprobs), atol=1e-5)


def test_scan_session_holds_the_dequantised_params():
  params = _nf4_params()
  s = SamplerSession(params, C, max_total_len=12, temperature=0.0, eos_ids=(), dtype=jnp.float32, impl="scan",
                     dense_base=True)
  want = dequantize_params(params, jnp.float32)
  assert jax.tree.structure(s.params) == jax.tree.structure(want)
  jax.tree.map(np.testing.assert_array_equal, s.params, want)


def test_unrolled_dequantize_equals_preparing_the_dequantised_params():
  params = _nf4_params()
  got = prepare_unrolled(params, C, jnp.float32, dequantize=True)
  want = prepare_unrolled(dequantize_params(params, jnp.float32), C, jnp.float32)
  assert "quantized" not in got
  assert jax.tree.structure(got) == jax.tree.structure(want)
  # f32 rounding only: XLA fuses the per-layer and the stacked dequantisation differently
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-8), got, want)


def test_dense_rollouts_is_an_rl_setting_a_run_may_resume_with_changed():
  from configs import common
  import ml_collections
  config = common.rl(ml_collections.ConfigDict(), prompts_per_step=2, group_size=2, max_new_tokens=4, temperature=1.0)
  assert config.rl.dense_rollouts is False
  saved = config.to_dict()
  config.rl.dense_rollouts = True
  assert config_diff(saved, config.to_dict()) == []
  config.rl.top_p = 0.9
  assert config_diff(saved, config.to_dict()) == [("rl.top_p", 1.0, 0.9)]
