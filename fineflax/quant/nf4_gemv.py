"""y = x @ W for an NF4 kernel W [K, N]: one Pallas (Triton) kernel that reads the 4-bit codes (any M rows).

XLA does not fuse NF4 dequantisation into a matmul: `x @ W.dequantize()` writes the dense W and reads it
back. Here each program owns a [bm, bn] output tile, loops over its K range inside (f32 accumulators in
registers; HBM partials only along an explicit split-K grid axis) and decodes each [bk, bn] code tile once.

  W [K, N] row-major, element e = k N + n; codes byte (k, c) = (q[k, 2c] << 4) | q[k, 2c + 1]; N % 64 == 0, so
  block b = e // 64 = k N/64 + n // 64 is one row's 64 outputs.  Column group g of a tile = outputs
  [64 g, 64 g + 64) = code columns [32 g, 32 g + 32), one scale a[k, g] a row:
    W[k, 64 g + 2 c]     = dtype(NF4[byte >> 4] * a[k, g])      (even outputs, high nibbles)
    W[k, 64 g + 2 c + 1] = dtype(NF4[byte & 15] * a[k, g])      (odd outputs, low nibbles)
    a[k, g] = code8[qabs[k, g]] * absmax2[b // 256] + offset    (double quantisation; `scales="kernel"`)
  even[s, m, :] / odd[s, m, :] = sum over split s's K range of x[m, k] W[k, even / odd n]  (f32); y = interleave.

W's values are exactly `NF4Tensor.dequantize(dtype)`'s (f32 product, then dtype), so y equals x @
W.dequantize(dtype) up to the order of the f32 sums. Decode methods (`KernelConfig.decode`):
  "gather": NF4[q] as one load a nibble from a 16-entry f32 table (L1-resident): O(1) a weight;
  "select": a 15-select tree on q's bits (no table; the previous kernel's method).
`scales`: "kernel" decodes the double-quantised absmax in the kernel from its uint8 (1/64 byte a weight,
two table loads a row and group); "f32" takes `absmax_f32()` computed by XLA before the call.
`path`: "dot" multiplies the decoded bf16/f32 tile on the tensor cores (bm >= 16; padded rows);
"fma": x[:, :, None] * W[None] summed over k on the CUDA cores (for M <= 8, no padding to 16).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from fineflax.quant.blockwise import dynamic_code, rounded
from fineflax.quant.nf4 import ABSMAX_BLOCKSIZE, NF4_CODE, NF4Tensor
from fineflax.quant.nf4_layer import NF4Layer

DECODES = ("gather", "select")
PATHS = ("dot", "fma")
SCALES = ("kernel", "f32")


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """One variant of the kernel: decode method, tile sizes, split-K, Triton launch parameters.

  bm rows (power of 2; >= 16 for "dot"), bn outputs (multiple of 64, power of 2), bk rows of W a loop step
  (power of 2, >= 16), split_k programs along K (each loops over K / split_k rows).
  """
  decode: str = "gather"
  path: str = "dot"
  scales: str = "kernel"
  bm: int = 16
  bn: int = 128
  bk: int = 128
  split_k: int = 1
  num_warps: int = 4
  num_stages: int = 2

  def check(self) -> None:
    def pow2(v):
      return v > 0 and v & (v - 1) == 0
    for name, value, allowed in (("decode", self.decode, DECODES), ("path", self.path, PATHS),
                                 ("scales", self.scales, SCALES)):
      if value not in allowed:
        raise ValueError(f"KernelConfig.{name}={value!r}; expected one of {allowed}")
    if not pow2(self.bm) or (self.path == "dot" and self.bm < 16):
      raise ValueError(f"KernelConfig.bm={self.bm}: a power of 2 (>= 16 for path 'dot')")
    if self.bn % 64 or not pow2(self.bn):
      raise ValueError(f"KernelConfig.bn={self.bn}: a power of 2, multiple of 64")
    if not pow2(self.bk) or self.bk < 16:
      raise ValueError(f"KernelConfig.bk={self.bk}: a power of 2, >= 16")
    if self.split_k < 1:
      raise ValueError(f"KernelConfig.split_k={self.split_k}: >= 1")

  def name(self) -> str:
    return (f"{self.decode}/{self.path}/{self.scales} bm{self.bm} bn{self.bn} bk{self.bk} sk{self.split_k} "
            f"w{self.num_warps} s{self.num_stages}")


def default_config(m: int) -> KernelConfig:
  """The variant used without a measured table entry: FMA for M <= 8, else dot with bm = min(pow2(M), 64)."""
  if m <= 8:
    return KernelConfig(path="fma", bm=1 << max(0, (m - 1).bit_length()), bn=64, bk=128)
  return KernelConfig(path="dot", bm=min(64, 1 << (m - 1).bit_length()), bn=64, bk=128)


def unsupported_reason(x_shape, w, cfg: KernelConfig) -> str | None:
  """None when `nf4_matmul(x, w, cfg)` applies, else a one-line reason naming the value at fault."""
  if isinstance(w, NF4Layer):
    w = jax.eval_shape(w.sliced)  # layer i's shapes, nothing computed
  if not isinstance(w, NF4Tensor):
    return f"W is a {type(w).__name__}, not an NF4Tensor"
  if w.lead_shape or len(w.shape) != 2:
    return f"NF4 W of shape {w.shape} with leading axes {w.lead_shape}: one unstacked [K, N] matrix needed"
  if w.blocksize != 64:
    return f"NF4 blocksize={w.blocksize}; the kernel needs 64"
  k, n = w.shape
  if len(x_shape) != 2 or x_shape[1] != k or x_shape[0] < 1:
    return f"x of shape {tuple(x_shape)} for W [K={k}, N={n}]: [M >= 1, {k}] needed"
  if n % cfg.bn:
    return f"N={n} is not a multiple of bn={cfg.bn}"
  if k % (cfg.bk * cfg.split_k):
    return f"K={k} is not a multiple of bk * split_k = {cfg.bk} * {cfg.split_k}"
  return None


def nf4_select(q):
  """NF4[q] for int32 codes q in [0, 16) as a select tree on q's bits."""
  level = [jnp.float32(float(v)) for v in np.asarray(NF4_CODE, np.float32)]
  for bit in (1, 2, 4, 8):
    level = [jnp.where((q & bit) != 0, level[i + 1], level[i]) for i in range(0, len(level), 2)]
  return level[0]


def _kernel(x_ref, codes_ref, qabs_ref, absmax2_ref, offset_ref, nf4_ref, code8_ref, even_ref, odd_ref, *,
            cfg: KernelConfig, k_split: int, groups_per_row: int, w_dtype, acc_dtype, interpret: bool):
  from jax.experimental import pallas as pl

  groups = cfg.bn // 64
  split = pl.program_id(2)
  col_group0 = pl.program_id(1) * groups
  precision = jax.lax.Precision.HIGHEST if acc_dtype == jnp.float32 else None
  operand_dtype = acc_dtype if cfg.path == "dot" else jnp.float32  # FMA: f32 products of the exact operands

  def nf4(q):
    return nf4_ref[q] if cfg.decode == "gather" else nf4_select(q)

  def scale(k0, g):  # [bk, 1] f32 scales of column group g for rows k0 .. k0 + bk of this split
    if cfg.scales == "f32":
      return qabs_ref[pl.ds(k0, cfg.bk), pl.ds(g, 1)]
    qa = qabs_ref[pl.ds(k0, cfg.bk), pl.ds(g, 1)].astype(jnp.int32)
    rows = split * k_split + k0 + jax.lax.broadcasted_iota(jnp.int32, (cfg.bk, 1), 0)
    block = rows * groups_per_row + col_group0 + g
    return rounded(code8_ref[qa] * absmax2_ref[block // ABSMAX_BLOCKSIZE]) + offset_ref[0]  # as absmax_f32

  def product(x, w):
    if cfg.path == "dot":
      return jnp.dot(x, w, preferred_element_type=jnp.float32, precision=precision)
    return jnp.sum(x[:, :, None] * w[None, :, :], axis=1)

  def step(i, accs):
    k0 = pl.multiple_of(i * cfg.bk, cfg.bk)
    x = x_ref[:, pl.ds(k0, cfg.bk)].astype(operand_dtype)
    out = []
    for g in range(groups):
      codes = codes_ref[pl.ds(k0, cfg.bk), pl.ds(g * 32, 32)].astype(jnp.int32)
      a = scale(k0, g)
      for q, acc in (((codes >> 4) & 15, accs[2 * g]), (codes & 15, accs[2 * g + 1])):
        w = (nf4(q) * a).astype(w_dtype)
        if interpret and cfg.path == "fma" and w_dtype == jnp.bfloat16:  # XLA:CPU would drop the bf16 rounding
          w = jax.lax.reduce_precision(w.astype(jnp.float32), exponent_bits=8, mantissa_bits=7)
        w = w.astype(operand_dtype)
        out.append(acc + product(x, w))
    return tuple(out)

  zeros = tuple(jnp.zeros((cfg.bm, 32), jnp.float32) for _ in range(2 * groups))
  accs = jax.lax.fori_loop(0, k_split // cfg.bk, step, zeros)
  for g in range(groups):
    even_ref[:, pl.ds(g * 32, 32)] = accs[2 * g]
    odd_ref[:, pl.ds(g * 32, 32)] = accs[2 * g + 1]


@functools.partial(jax.jit, static_argnames=("dtype", "cfg", "interpret"))
def nf4_matmul(x: jnp.ndarray, w: NF4Tensor | NF4Layer, dtype=jnp.bfloat16, cfg: KernelConfig | None = None,
               interpret: bool = False) -> jnp.ndarray:
  """x [M, K] (bf16 or f32) @ w.dequantize(dtype) (NF4 [K, N]) -> [M, N] of result_type(x, dtype).

  w may be an `NF4Layer` (layer i of a stacked kernel): read in place, not sliced.

  cfg: the variant (default `default_config(M)`); a product outside `unsupported_reason` raises ValueError.
  interpret=True runs the kernel in Pallas' interpreter (any backend; for tests).
  """
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plgpu

  m = x.shape[0] if x.ndim == 2 else 0
  cfg = default_config(max(m, 1)) if cfg is None else cfg
  cfg.check()
  reason = unsupported_reason(x.shape, w, cfg)
  if reason:
    raise ValueError(f"nf4_matmul: {reason}")
  if not w.double_quant and cfg.scales == "kernel":
    cfg = dataclasses.replace(cfg, scales="f32")  # no nested quantisation to decode
  stacked, layer = (w.stacked, w.layer) if isinstance(w, NF4Layer) else (jax.tree.map(lambda a: a[None], w), 0)
  n_layers = stacked.codes.shape[0]
  k, n = w.shape
  out_dtype = jnp.result_type(x.dtype, dtype)
  acc_dtype = jnp.float32 if out_dtype == jnp.float32 else jnp.bfloat16
  mt = -(-m // cfg.bm)
  xp = jnp.pad(x, ((0, mt * cfg.bm - m), (0, 0)))
  codes = stacked.codes.reshape(n_layers, k, n // 2)
  f32 = cfg.scales == "f32"
  if f32:  # the f32 scales of this layer only (K N / 64 of them), computed by XLA
    one = jax.tree.map(lambda a: a[layer], stacked)
    qabs, layer_of_scales = one.absmax_f32().reshape(1, k, n // 64), 0
    absmax2, offset = jnp.zeros((n_layers, 1), jnp.float32), jnp.zeros((n_layers, 1), jnp.float32)
  else:
    qabs, layer_of_scales = stacked.absmax.reshape(n_layers, k, n // 64), layer
    absmax2 = stacked.absmax_scale.astype(jnp.float32).reshape(n_layers, -1)
    offset = stacked.absmax_offset.astype(jnp.float32).reshape(n_layers, 1)
  nf4_table, code8 = jnp.asarray(NF4_CODE), jnp.asarray(dynamic_code())
  k_split = k // cfg.split_k
  kernel = functools.partial(_kernel, cfg=cfg, k_split=k_split, groups_per_row=n // 64, w_dtype=jnp.dtype(dtype),
                             acc_dtype=acc_dtype, interpret=interpret)
  whole = lambda a: pl.BlockSpec(a.shape, lambda i, j, s: (0,) * a.ndim)
  layer_row = lambda a: pl.BlockSpec((None, a.shape[1]), lambda i, j, s: (layer, 0))
  half = jax.ShapeDtypeStruct((cfg.split_k, mt * cfg.bm, n // 2), jnp.float32)
  out_spec = pl.BlockSpec((None, cfg.bm, cfg.bn // 2), lambda i, j, s: (s, i, j))
  params = None if interpret else plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
  even, odd = pl.pallas_call(
      kernel, out_shape=(half, half), grid=(mt, n // cfg.bn, cfg.split_k),
      in_specs=[pl.BlockSpec((cfg.bm, k_split), lambda i, j, s: (i, s)),
                pl.BlockSpec((None, k_split, cfg.bn // 2), lambda i, j, s: (layer, s, j)),
                pl.BlockSpec((None, k_split, cfg.bn // 64), lambda i, j, s: (layer_of_scales, s, j)),
                layer_row(absmax2), layer_row(offset), whole(nf4_table), whole(code8)],
      out_specs=(out_spec, out_spec), interpret=interpret, compiler_params=params,
  )(xp, codes, qabs, absmax2, offset, nf4_table, code8)
  y = jnp.stack([even.sum(0), odd.sum(0)], axis=-1).reshape(mt * cfg.bm, n)  # interleave: n = 2 c (+ 1)
  return y[:m].astype(out_dtype)
