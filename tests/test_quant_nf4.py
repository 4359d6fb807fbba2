"""NF4 / int8 quantisation: byte parity with bitsandbytes, storage formula, error bounds, model forward."""
from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")
import bitsandbytes.functional as F  # noqa: E402

from fineflax.models import ModelConfig, forward, init_params  # noqa: E402
from fineflax.models.quantize import quantize_params  # noqa: E402
from fineflax.quant import (NF4_CODE, Int8Tensor, NF4Tensor, bits_per_parameter, quantize_layers,  # noqa: E402
                            dequantize_params, dynamic_code, quantize_int8, quantize_nf4, quantize_tensor)
from fineflax.quant.blockwise import nearest_code  # noqa: E402


@pytest.fixture(scope="module")
def bnb_reference():
  """bitsandbytes' device-neutral reference kernels (backends/default/ops.py), loaded without registering.

  On CPU, bnb's public quantize_4bit runs exactly these; its 8-bit quantiser and some dequantisers run C
  kernels (a 65536-entry lookup table for 8-bit codes; a 4-bit dequantiser that is wrong when the last
  dimension is not a multiple of the block), so those are compared separately.
  """
  import bitsandbytes._ops as bops
  captured = {}
  original = bops.register_kernel
  bops.register_kernel = lambda name, device: (lambda fn: captured.setdefault(name, fn))
  try:
    path = bnb.__path__[0] + "/backends/default/ops.py"
    spec = importlib.util.spec_from_file_location("bitsandbytes.backends.default._fineflax_ref", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  finally:
    bops.register_kernel = original
  compute = module._dequantize_4bit_compute  # unwrap bnb's torch.compile wrapper (slow to compile)
  captured["dequantize_4bit_compute"] = getattr(compute, "__wrapped__", compute)
  return captured


def _bnb_nf4(x: np.ndarray, compress: bool):
  return F.quantize_4bit(torch.from_numpy(x), blocksize=64, compress_statistics=compress, quant_type="nf4")


SHAPES = [(128, 128), (64, 96), (3, 37), (300, 512), (7,)]


def test_code_books_match_bitsandbytes():
  np.testing.assert_array_equal(NF4_CODE, F.get_4bit_type("nf4", device="cpu").numpy())
  np.testing.assert_array_equal(dynamic_code(), F.create_dynamic_map(signed=True).numpy())


@pytest.mark.fast
@pytest.mark.parametrize("shape", SHAPES)
def test_nf4_bytes_and_absmax_equal_bitsandbytes(shape, bnb_reference):
  x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32) * 0.05
  packed, state = _bnb_nf4(x, compress=False)
  t = quantize_nf4(jnp.asarray(x), blocksize=64, double_quant=False)
  nbytes = packed.numel()  # bnb packs ceil(n / 2) bytes; we pad to whole blocks
  np.testing.assert_array_equal(np.asarray(t.codes)[:nbytes], packed.numpy().reshape(-1))
  assert np.all(np.asarray(t.codes)[nbytes:] == 0x77)  # padding is zeros -> code 7 (exact 0)
  np.testing.assert_array_equal(np.asarray(t.absmax), state.absmax.numpy())
  ours = np.asarray(t.dequantize(jnp.float32))
  ref = bnb_reference["dequantize_4bit_compute"](packed.reshape(-1), state.absmax,
                                                 F.get_4bit_type("nf4", device="cpu"), 64, shape,
                                                 torch.float32).numpy()
  np.testing.assert_array_equal(ours, ref)
  if shape[-1] % 64 == 0:  # bnb's CPU C dequantiser is wrong otherwise (odd sizes take torch.compile)
    np.testing.assert_array_equal(ours, F.dequantize_4bit(packed, state).numpy())


@pytest.mark.fast
@pytest.mark.parametrize("shape", [(128, 128), (3, 37), (300, 512), (1024, 512)])
def test_nf4_double_quant_equals_bitsandbytes(shape, bnb_reference):
  x = np.random.default_rng(7 + sum(shape)).standard_normal(shape).astype(np.float32)
  packed, state = _bnb_nf4(x, compress=True)
  t = quantize_nf4(jnp.asarray(x), blocksize=64, double_quant=True)
  np.testing.assert_array_equal(np.asarray(t.codes)[:packed.numel()], packed.numpy().reshape(-1))
  # offset = mean(absmax): same up to float summation order (torch vs XLA)
  np.testing.assert_allclose(float(t.absmax_offset), float(state.offset), rtol=1e-6)
  # Nested 8-bit codes: bnb's reference quantiser fed the same (absmax - offset) gives identical bytes.
  absmax = torch.from_numpy(np.array(quantize_nf4(jnp.asarray(x), 64, double_quant=False).absmax))
  q8, absmax2 = bnb_reference["bitsandbytes::quantize_blockwise"](
      absmax - float(t.absmax_offset), F.create_dynamic_map(signed=True), 256)
  np.testing.assert_array_equal(np.asarray(t.absmax), q8.numpy())
  np.testing.assert_array_equal(np.asarray(t.absmax_scale), absmax2.numpy())
  # bnb's public CPU path (a 65536-entry lookup table) agrees except within 2/65535 of a midpoint.
  code = dynamic_code()
  s = ((absmax - float(state.offset)) / torch.repeat_interleave(state.state2.absmax, 256)[:absmax.numel()]).numpy()
  mids = (code[:-1] + code[1:]) / 2
  near_mid = np.min(np.abs(s[:, None] - mids[None]), axis=1) < 2.5 / 65535
  agree = np.asarray(t.absmax) == state.absmax.numpy()
  assert np.all(agree | near_mid)
  if shape[-1] % 64:  # bnb's CPU 4-bit dequantiser is wrong for such shapes (see bnb_reference)
    return
  # Decoding our arrays with bnb's own dequantize_4bit gives our dequantized tensor.
  state2 = F.QuantState(absmax=torch.from_numpy(np.array(t.absmax_scale)), code=torch.from_numpy(code),
                        blocksize=256, dtype=torch.float32)
  ours_state = F.QuantState(absmax=torch.from_numpy(np.array(t.absmax)), shape=torch.Size(shape),
                            dtype=torch.float32, blocksize=64, code=torch.from_numpy(NF4_CODE),
                            quant_type="nf4", offset=torch.tensor(float(t.absmax_offset)), state2=state2)
  codes = torch.from_numpy(np.asarray(t.codes)[:packed.numel()].copy()).reshape(-1, 1)
  np.testing.assert_allclose(np.asarray(t.dequantize(jnp.float32)),
                             F.dequantize_4bit(codes, ours_state).numpy(), rtol=1e-6, atol=1e-7)


def test_nearest_code_ties_go_to_lower_index():
  code = np.array([-1.0, 0.0, 0.5, 1.0], np.float32)
  s = jnp.asarray([-0.5, 0.25, 0.75, 0.2500001, -1.0, 1.0])
  np.testing.assert_array_equal(np.asarray(nearest_code(s, code)), [0, 1, 2, 2, 0, 3])


def test_bits_per_parameter_formula():
  n_in, n_out = 1024, 512
  w = jnp.asarray(np.random.default_rng(0).standard_normal((2, n_in, n_out)), jnp.bfloat16)
  n = n_in * n_out
  dq = quantize_nf4(w, 64, True, lead_dims=1)
  assert bits_per_parameter(dq) == pytest.approx(4 + 8 / 64 + 32 / (64 * 256) + 32 / n)
  assert 4.126 < bits_per_parameter(dq) < 4.128
  assert bits_per_parameter(quantize_nf4(w, 64, False, lead_dims=1)) == pytest.approx(4 + 32 / 64)
  assert bits_per_parameter(quantize_int8(w)) == pytest.approx(8 + 32 / n_in)


def test_quantisation_error_4096_matches_bitsandbytes():
  x = np.random.default_rng(1).standard_normal((4096, 4096)).astype(np.float32)
  packed, state = _bnb_nf4(x, compress=True)
  bnb_err = np.abs(F.dequantize_4bit(packed, state).numpy() - x).mean()
  t = jax.jit(lambda a: quantize_nf4(a, 64, True))(jnp.asarray(x))
  ours_err = float(jnp.mean(jnp.abs(jax.jit(lambda q: q.dequantize(jnp.float32))(t) - x)))
  np.testing.assert_allclose(ours_err, bnb_err, rtol=1e-3)
  assert bits_per_parameter(t) == pytest.approx(4.127, abs=5e-4)


def test_int8_round_trip_bound():
  rng = np.random.default_rng(3)
  w = rng.standard_normal((3, 48, 40)).astype(np.float32)
  w[1, :, 5] = 0.0  # an all-zero column
  t = quantize_int8(jnp.asarray(w))
  err = np.abs(np.asarray(t.dequantize(jnp.float32)) - w)
  assert np.all(err <= np.asarray(t.scale)[:, None, :] / 2 + 1e-7)
  assert np.all(np.asarray(t.dequantize(jnp.float32))[1, :, 5] == 0)
  np.testing.assert_allclose(np.abs(np.asarray(t.q, np.float32)).max(axis=-2)[0], 127)


def test_stacked_quantisation_equals_per_layer():
  w = jnp.asarray(np.random.default_rng(4).standard_normal((3, 40, 24)), jnp.float32)
  stacked = quantize_nf4(w, 64, True, lead_dims=1)
  assert stacked.shape == (40, 24) and stacked.codes.shape[0] == 3
  for i in range(3):
    one = quantize_nf4(w[i], 64, True)
    np.testing.assert_array_equal(np.asarray(stacked.codes)[i], np.asarray(one.codes))
    for a, b in zip(jax.tree_util.tree_leaves(stacked)[1:], jax.tree_util.tree_leaves(one)[1:]):
      np.testing.assert_allclose(np.asarray(a)[i], np.asarray(b), rtol=1e-6)  # mean: summation order
    sliced = jax.tree_util.tree_map(lambda a: a[i], stacked)  # what lax.scan hands a layer
    np.testing.assert_allclose(np.asarray(sliced.dequantize(jnp.float32)),
                               np.asarray(one.dequantize(jnp.float32)), rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("kind,double_quant", [("nf4", True), ("nf4", False), ("int8", True)])
def test_layer_by_layer_quantisation_equals_stacked(kind, double_quant):
  """quantize_layers (one layer on the device at a time, written in place) == quantising the stacked
  kernel, and a NumPy kernel in quantize_params takes that path (same leaves as a jax kernel)."""
  w = np.random.default_rng(5).standard_normal((3, 40, 24)).astype(np.float32)
  want = quantize_tensor(jnp.asarray(w), kind, double_quant=double_quant, lead_dims=1)
  got = quantize_layers(lambda i: w[i], 3, kind, double_quant=double_quant)
  via_params = quantize_params({"layers": {"q": {"kernel": w}}}, targets=("q",), kind=kind,
                               double_quant=double_quant)["layers"]["q"]["kernel"]
  for tensor in (got, via_params):
    assert type(tensor) is type(want) and tensor.shape == want.shape and tensor.dtype == want.dtype
    assert jax.tree_util.tree_structure(tensor) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(tensor), jax.tree_util.tree_leaves(want)):
      assert a.shape == b.shape and a.dtype == b.dtype
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)  # offsets: summation order
    np.testing.assert_array_equal(np.asarray(jax.tree_util.tree_leaves(tensor)[0]),
                                  np.asarray(jax.tree_util.tree_leaves(want)[0]))  # codes / q: exact

CFG = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16, attention_bias=True)


@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_quantised_forward_equals_dequantised_forward(kind):
  params = init_params(CFG, jax.random.key(0))
  qparams = quantize_params(params, kind=kind)
  for name in ("q", "k", "v", "o", "gate", "up", "down"):
    assert isinstance(qparams["layers"][name]["kernel"], NF4Tensor if kind == "nf4" else Int8Tensor)
  for path in (("embed",), ("final_norm",), ("lm_head", "kernel"), ("layers", "attn_norm"),
               ("layers", "q", "bias")):
    a, b = params, qparams
    for p in path:
      a, b = a[p], b[p]
    assert a is b
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 9)))
  fwd = jax.jit(forward, static_argnums=1)
  got = fwd(qparams, CFG, tokens)
  dense = jax.jit(dequantize_params, static_argnums=1)(qparams, jnp.float32)
  np.testing.assert_allclose(np.asarray(got), np.asarray(fwd(dense, CFG, tokens)), atol=1e-5)
  assert float(jnp.max(jnp.abs(got - fwd(params, CFG, tokens)))) > 1e-5  # quantisation is lossy


def test_bad_input_errors():
  w = jnp.ones((64, 64))
  with pytest.raises(ValueError, match="blocksize=48"):
    quantize_nf4(w, blocksize=48)
  with pytest.raises(ValueError, match="empty"):
    quantize_nf4(jnp.ones((0, 4)))
  params = init_params(CFG, jax.random.key(0))
  with pytest.raises(ValueError, match=r"'qkv' matches no linear layer; available: \['q', 'k', 'v', 'o', 'gate', 'up', 'down'\]"):
    quantize_params(params, targets=("q", "qkv"))
  with pytest.raises(ValueError, match="kind='int4'"):
    quantize_params(params, kind="int4")
  with pytest.raises(ValueError, match="per output column"):
    quantize_int8(jnp.ones((2, 4, 4)), lead_dims=0)


def _with_zero_blocks(shape, seed):
  """Normal data with all-zero 64-blocks: the first, one in the middle, and the (possibly short) last."""
  x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32).reshape(-1)
  n = x.size
  x[:64] = 0.0
  x[(n // 128) * 64:(n // 128) * 64 + 64] = 0.0
  x[(n - 1) // 64 * 64:] = 0.0
  return x.reshape(shape)


@pytest.mark.parametrize("shape", [(8, 64), (7, 37), (3, 100)])
@pytest.mark.parametrize("double_quant", [False, True])
def test_all_zero_blocks_equal_bitsandbytes_and_dequantise_to_zero(shape, double_quant, bnb_reference):
  """Regression: absmax was floored with the subnormal 1e-38, which XLA flushes to 0 -> NaN -> code 0
  (-1.0); with double quantisation such a block dequantised to -absmax."""
  x = _with_zero_blocks(shape, sum(shape))
  packed, state = _bnb_nf4(x, compress=double_quant)
  t = quantize_nf4(jnp.asarray(x), blocksize=64, double_quant=double_quant)
  codes = np.asarray(t.codes)
  np.testing.assert_array_equal(codes[:packed.numel()], packed.numpy().reshape(-1))
  zero_blocks = np.all(np.pad(x.reshape(-1), (0, t.num_blocks * 64 - x.size)).reshape(-1, 64) == 0, axis=1)
  assert zero_blocks.sum() >= 2 and np.all(codes.reshape(t.num_blocks, 32)[zero_blocks] == 0x77)
  absmax = np.asarray(quantize_nf4(jnp.asarray(x), 64, double_quant=False).absmax)
  ref_absmax = (state.absmax if not double_quant else
                bnb_reference["bitsandbytes::quantize_4bit"](torch.from_numpy(x), 64, "nf4", torch.uint8)[1])
  np.testing.assert_array_equal(absmax.view(np.uint32), ref_absmax.numpy().view(np.uint32))  # bit for bit
  if double_quant:  # the nested 8-bit codes, as bnb's reference quantiser computes them from our offset
    q8, absmax2 = bnb_reference["bitsandbytes::quantize_blockwise"](
        torch.from_numpy(absmax.copy()) - float(t.absmax_offset), F.create_dynamic_map(signed=True), 256)
    np.testing.assert_array_equal(np.asarray(t.absmax), q8.numpy())
    np.testing.assert_array_equal(np.asarray(t.absmax_scale), absmax2.numpy())
  dense = np.asarray(t.dequantize(jnp.float32))
  assert np.all(np.isfinite(dense))
  assert np.all(dense.reshape(-1)[x.reshape(-1) == 0] == 0.0)  # exact zeros (every zero maps to code 7)
  if shape[-1] % 64 == 0:  # bnb's own CPU dequantiser (wrong for other shapes, see bnb_reference)
    assert np.all(F.dequantize_4bit(packed, state).numpy().reshape(-1)[x.reshape(-1) == 0] == 0.0)


@pytest.mark.parametrize("shape", [(4, 64), (3, 37)])
@pytest.mark.parametrize("double_quant", [False, True])
def test_all_zero_tensor_quantises_to_zero_code(shape, double_quant):
  """4-bit codes equal bnb's (all 0x77). Not compared: with a short last block bnb's stored absmax is the
  subnormal 1e-38, so its offset and nested statistics are subnormal, which XLA flushes to 0."""
  x = np.zeros(shape, np.float32)
  packed, _ = _bnb_nf4(x, compress=double_quant)
  t = quantize_nf4(jnp.asarray(x), 64, double_quant=double_quant)
  np.testing.assert_array_equal(np.asarray(t.codes)[:packed.numel()], packed.numpy().reshape(-1))
  assert np.all(np.asarray(t.codes) == 0x77)
  assert np.all(np.asarray(t.dequantize(jnp.float32)) == 0.0)


def test_shift_unpacked_dequantize_equals_interleaved_table_lookup_bit_for_bit():
  # dequantize() unpacks nibbles by broadcast + shift; it must equal the nibble interleave by stack
  # (high nibble first) + NF4_CODE gather for every code and dtype
  from fineflax.quant.nf4 import NF4_CODE, quantize_nf4
  w = jax.random.normal(jax.random.PRNGKey(0), (2, 40, 33)) * 0.05  # 1320 values: a short last block
  t = quantize_nf4(w, lead_dims=1)

  def table(t_, dtype):
    q = jnp.stack([t_.codes >> 4, t_.codes & 0xF], axis=-1).reshape(2, -1)
    ref = jnp.asarray(NF4_CODE)[q.astype(jnp.int32)].reshape(2, t_.num_blocks, 64) * t_.absmax_f32()[..., None]
    return ref.reshape(2, -1)[:, :40 * 33].reshape(2, 40, 33).astype(dtype)

  for dtype in (jnp.float32, jnp.bfloat16):
    got, ref = jax.jit(lambda t_: (t_.dequantize(dtype), table(t_, dtype)))(t)
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32)))
