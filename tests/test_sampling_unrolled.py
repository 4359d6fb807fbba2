"""The unrolled decoder (`fineflax.models.unrolled`, the sampler's default on GPUs) against the scan decoder it
replaces: greedy tokens identical and log-probs equal to f32 rounding for tiny random f32 models (plain,
with LoRA, on an NF4 base, across the Llama / Qwen2 / Qwen3 / Gemma 2 numerics), and its compiled decode
step reads weights in place (no per-layer dynamic-slice copies of weights)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _sampling_fixtures import EVERYTHING, LLAMA, random_params
from fineflax import lora as L
from fineflax.models import ModelConfig, init_cache, init_params, quantize_params
from fineflax.models.unrolled import init_unrolled_cache, prepare_unrolled
from fineflax.sampling import SamplerSession, decode_impl
from fineflax.engine.decode import decode_chunk
from fineflax.engine.processors import SamplingConfig

PROMPTS = [[5, 9, 14, 3], [7, 7, 21], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


def _lora(config, seed=1):
  cfg = L.LoraConfig(r=4, alpha=8.0, target_modules=TARGETS)
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(0.3 * rng.standard_normal(shape), jnp.float32)
  shapes = config.linear_shapes()
  lora = {n: {"a": normal(config.num_layers, shapes[n][0], cfg.r),
              "b": normal(config.num_layers, cfg.r, shapes[n][1])} for n in TARGETS}
  L.check_lora(lora, config, cfg)
  return lora, L.lora_scale(cfg)


def _session_run(params, config, impl, append: bool, **kw):
  """start, decode 5 (, append tool tokens to rows 0 and 2, decode 6: the session's whole cache protocol)."""
  s = SamplerSession(params, config, max_total_len=24, temperature=0.0, eos_ids=(), dtype=jnp.float32,
                     impl=impl, **kw)
  s.start(PROMPTS)
  s.decode(5)
  if append:
    s.append({0: [11, 12], 2: [40]})
    s.decode(5)
  return s.result()


def _assert_same(params, config, append=False, **kw):
  old, new = (_session_run(params, config, impl, append, **kw) for impl in ("scan", "unrolled"))
  np.testing.assert_array_equal(new.tokens, old.tokens)
  np.testing.assert_array_equal(new.mask, old.mask)
  np.testing.assert_allclose(new.raw_logprobs, old.raw_logprobs, atol=2e-5)
  assert len({tuple(r) for r in old.tokens.tolist()}) == len(PROMPTS)  # distinct continuations
  return old


def test_unrolled_greedy_equals_scan_every_numerics_switch_with_lora():
  params = random_params(EVERYTHING)
  lora, scale = _lora(EVERYTHING)
  _assert_same(params, EVERYTHING, lora=lora, lora_scale=scale)


def test_unrolled_on_nf4_base_with_lora_equals_scan():
  """q/k/v and gate/up NF4 (kept stacked, not copied, not fused); o and down dense (fused per layer)."""
  params = random_params(LLAMA)
  base = quantize_params(params, targets=("q", "k", "v", "gate", "up"), kind="nf4")
  dparams = prepare_unrolled(base, LLAMA, jnp.float32)
  assert set(dparams["quantized"]) == {"q", "k", "v", "gate", "up"}
  assert dparams["quantized"]["q"]["kernel"] is base["layers"]["q"]["kernel"]
  layer = dparams["layers"][1]
  assert "qkv" not in layer and "gate_up" not in layer
  np.testing.assert_array_equal(layer["down"]["kernel_t"], params["layers"]["down"]["kernel"][1].T)
  lora, scale = _lora(LLAMA)
  _assert_same(base, LLAMA, append=True, lora=lora, lora_scale=scale)


def test_prepare_unrolled_fuses_qkv_and_gate_up():
  params = random_params(EVERYTHING)
  layer, i = prepare_unrolled(params, EVERYTHING, jnp.float32)["layers"][1], 1
  cat = lambda names, leaf: jnp.concatenate([params["layers"][n][leaf][i] for n in names], axis=-1)
  np.testing.assert_array_equal(layer["qkv"]["kernel_t"], cat(("q", "k", "v"), "kernel").T)
  np.testing.assert_array_equal(layer["qkv"]["bias"], cat(("q", "k", "v"), "bias"))
  np.testing.assert_array_equal(layer["gate_up"]["kernel_t"], cat(("gate", "up"), "kernel").T)
  np.testing.assert_array_equal(layer["q_norm"], params["layers"]["q_norm"][i])


def test_decode_impl_choice(monkeypatch):
  monkeypatch.delenv("FINEFLAX_DECODE", raising=False)
  assert decode_impl("auto", backend="gpu") == "unrolled" and decode_impl(None, backend="gpu") == "unrolled"
  assert decode_impl("auto", backend="cpu") == "scan" and decode_impl("unrolled", backend="cpu") == "unrolled"
  monkeypatch.setenv("FINEFLAX_DECODE", "scan")
  assert decode_impl("auto", backend="gpu") == "scan" and decode_impl("unrolled") == "unrolled"
  with pytest.raises(ValueError, match="'loop'.*choose one of"):
    decode_impl("loop")


def _decode_hlo(config, impl, batch=1):
  sd = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), t)
  params = jax.eval_shape(lambda: init_params(config, jax.random.key(0), jnp.float32))
  cache = init_cache(config, batch, 32, jnp.float32)
  if impl == "unrolled":
    params = jax.eval_shape(lambda p: prepare_unrolled(p, config, jnp.float32), params)
    cache = init_unrolled_cache(config, batch, 32, jnp.float32)
  state = {"pending": jnp.zeros(batch, jnp.int32), "pos": jnp.zeros(batch, jnp.int32),
           "active": jnp.ones(batch, bool), "budget": jnp.ones(batch, jnp.int32)}
  return decode_chunk.lower(params, sd(cache), state, jax.random.key(0), jnp.zeros(4, jnp.int32), None, 1.0,
                            config=config, dtype=jnp.float32, sampling=SamplingConfig(0.0, 0, 1.0),
                            num_steps=4, impl=impl).compile().as_text()


def test_unrolled_decode_step_reads_weights_in_place():
  """In the optimised HLO of the decode loop (CPU backend), no instruction, fused or not, produces a
  weight-shaped array by a (dynamic) slice or copy: the scan path slices every linear's layer out of the
  stacked arrays each step (a copy; the GPU profile's memcpy), the unrolled path none."""
  config = ModelConfig(vocab_size=256, hidden_size=96, intermediate_size=160, num_layers=3, num_heads=6,
                       num_kv_heads=2, head_dim=16, tie_word_embeddings=True)
  h, q, kv, i = 96, 96, 32, 160
  weight_shapes = {(h, q), (h, kv), (q, h), (h, i), (i, h), (q, h), (h, q + 2 * kv), (q + 2 * kv, h),
                   (2 * i, h), (h, 2 * i)}
  op = re.compile(r"= f32\[([0-9,]+)\]\{[^}]*\} (dynamic-slice|slice|copy)\(")

  def weight_copies(txt):
    """Slices / copies (fused or not) whose result is weight-shaped, unit axes dropped."""
    return [m.group(0) for m in op.finditer(txt)
            if tuple(int(d) for d in m.group(1).split(",") if d != "1") in weight_shapes]

  scan = weight_copies(_decode_hlo(config, "scan"))
  assert len(scan) >= 4, scan  # the defect: per-layer weight slices copied out of the stacked arrays
  assert weight_copies(_decode_hlo(config, "unrolled")) == []


def test_kmajor_nf4_groups_fused_with_bias_and_lora_equal_scan(monkeypatch):
  """FINEFLAX_NF4_LAYOUT=kmajor: q|k|v and gate|up of an NF4 base become one K-major product each (biases
  concatenated, LoRA added per linear after the split); greedy tokens and log-probs equal the scan decoder's."""
  import dataclasses
  from fineflax.quant.nf4_kmajor import NF4KMajor
  monkeypatch.setenv("FINEFLAX_NF4_LAYOUT", "kmajor")
  config = dataclasses.replace(EVERYTHING, hidden_size=128, intermediate_size=192, head_dim=32)  # N % 64 == 0
  base = quantize_params(random_params(config), targets=TARGETS, kind="nf4")
  dparams = prepare_unrolled(base, config, jnp.float32)
  assert set(dparams["quantized"]) == {"qkv", "o", "gate_up", "down"}
  qkv = dparams["quantized"]["qkv"]
  assert isinstance(qkv["kernel"], NF4KMajor) and qkv["kernel"].shape == (128, 256)
  assert qkv["bias"].shape == (config.num_layers, 256)
  lora, scale = _lora(config)
  _assert_same(base, config, append=True, lora=lora, lora_scale=scale)
