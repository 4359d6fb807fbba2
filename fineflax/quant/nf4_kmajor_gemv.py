"""y = x @ W for a K-major NF4 kernel W [K, N] (`NF4KMajor`): one Pallas (Triton) kernel for M = 1 to 256 rows.

Grid (N / bn, S): program (j, s) owns outputs [j bn, (j + 1) bn) and the K range s of S = K / (2 bkb iters)
equal splits; it loops `iters` times over [64, bkb] code tiles of each of its bn / 64 output groups (each
output's bytes contiguous, so the sum over k stays in a thread's registers) and writes an f32 partial;
XLA sums the S partials. With xe = x[:, 0::2], xo = x[:, 1::2] and the tile's scales se, so [bkb] (vectors,
broadcast over the tile's 64 outputs):

  "fma" (M <= 8):             y[m, n] += sum_j NF4[hi] (se xe[m]) + NF4[lo] (so xo[m])      (f32; W's own
                               rounding to `dtype` is skipped: within dtype's rounding of W)
  "dot" (rows padded to pow2 >= 16):  y += xe @ dtype(NF4[hi] se)^T + xo @ dtype(NF4[lo] so)^T
                               (W exactly `dequantize(dtype)`'s values; f32 accumulation)
  "dot_t" (the same values):  y^T += dtype(NF4[hi] se) @ xe^T + dtype(NF4[lo] so) @ xo^T: the decoded tile is
                               the MMA's left operand as it lies (x arrives transposed; y^T transposed by XLA;
                               measured 1.05-1.15x slower than "dot")
  "deq" (any M):              `dequantize_planes` writes We = W[0::2]^T, Wo = W[1::2]^T [N, K/2] in `dtype`
                               (dequantize(dtype)'s values; one pass, 0.56 bytes read and 4 written a weight),
                               then y = xe @ We^T + xo @ Wo^T by XLA's GEMMs: for many rows, where the fused
                               paths' MMA loses to cuBLAS and XLA's own dequantise decodes by selects

Decode (`_decoder`): "shfl" reads NF4[q] from lane q's register by a warp shuffle, "gather" from a 16-entry f32
table (L1), "select" is a 15-select tree.

Measured on one H200 (benchmarks/RESULTS.md, section session_2026_11_29b; products timed inside one jit over
weight copies): on the 8B MLP products, M = 1 24-27 us (bf16 W 35-37, XLA 126-127), M = 16 54 us, M = 64 85 us.
Under FINEFLAX_NF4_KERNEL=auto the configuration comes from the measured table (`nf4_kernel_table.kmajor_choice`,
`nf4_kmajor_table.json`, written by `benchmarks/nf4_gemv.py`); its entries serve up to DOT_MAX_ROWS rows.
`default_config` (shfl, bn 64; fma bkb 128 x 2 tiles, dot bkb 128 x 4) serves shapes without an entry up to
DEFAULT_MAX_ROWS rows, and FINEFLAX_NF4_KERNEL=pallas.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from fineflax.quant.nf4 import NF4_CODE
from fineflax.quant.nf4_gemv import nf4_select
from fineflax.quant.nf4_kmajor import NF4KMajor
from fineflax.quant.nf4_layer import NF4Layer

PATHS = ("fma", "dot", "dot_t", "deq")
DECODES = ("shfl", "gather", "select")
FMA_MAX_ROWS = 4   # default fma rows (H200: at M = 4 0.8-1.2x bf16's speed); to 8 where a table entry says
MIN_PROGRAMS = 264  # two programs an SM of an H100 / H200 (132 SMs)
DEFAULT_MAX_ROWS = 64  # rows served without a measured entry (H200, M = 64: 0.46-0.66x XLA's time; M = 256: 0.8-1.4x)
DOT_MAX_ROWS = 256  # rows a measured table entry may serve (rollouts of 32 x 8 rows); above: XLA (prefill)


@dataclasses.dataclass(frozen=True)
class KMajorConfig:
  """path "fma" | "dot" | "dot_t" | "deq"; decode "shfl" | "gather" | "select"; bn outputs a program (a multiple of 64);
  bkb code bytes along K a tile (2 bkb rows of W; power of 2 >= 16); iters tiles a program; Triton warps; Triton
  software-pipelining stages of the tile loop (1: none; 2+: the next tiles' codes load while this one decodes)."""
  path: str = "fma"
  decode: str = "shfl"
  bn: int = 64
  bkb: int = 128
  iters: int = 2
  num_warps: int = 4
  num_stages: int = 1

  def name(self) -> str:
    stages = f" s{self.num_stages}" if self.num_stages != 1 else ""
    return f"kmajor {self.decode}/{self.path} bn{self.bn} bkb{self.bkb} x{self.iters} w{self.num_warps}{stages}"


def default_config(m: int, k: int, n: int) -> KMajorConfig | None:
  """The measured default for x [m, k] @ W [k, n], its tile shrunk to divide K / 2; fewer tiles a program (iters)
  while the grid has fewer than MIN_PROGRAMS programs on the fma path, MIN_PROGRAMS / 2 on the dot path (narrow
  products; H200, 8B k/v at M = 1: 7.1 us with one 128-byte tile a program and 8 warps, 10.5 us with four
  64-byte tiles). The dot path's 4 tiles a program write a quarter of one tile's split-K partials (H100, 8B at
  M = 64: q/o 23.6 against 29.3 us, down 77.1 against 110.7; RESULTS.md session_2026_12_08). None (XLA) for
  m > DEFAULT_MAX_ROWS or when no tile of >= 16 bytes divides K / 2."""
  if m < 1 or m > DEFAULT_MAX_ROWS:
    return None
  cfg = KMajorConfig() if m <= FMA_MAX_ROWS else KMajorConfig(path="dot", bkb=128, iters=4)
  while (k // 2) % (cfg.bkb * cfg.iters):
    smaller = dict(iters=cfg.iters // 2) if cfg.iters > 1 else dict(bkb=cfg.bkb // 2)
    cfg = dataclasses.replace(cfg, **smaller)
    if cfg.bkb < 16:
      return None
  programs = lambda c: n // c.bn * (k // 2 // (c.bkb * c.iters))
  while programs(cfg) < (MIN_PROGRAMS if cfg.path == "fma" else MIN_PROGRAMS // 2) and cfg.iters > 1:
    cfg = dataclasses.replace(cfg, iters=cfg.iters // 2)
  return cfg


def unsupported_reason(x_shape, w, cfg: KMajorConfig) -> str | None:
  """None when `kmajor_matmul(x, w, cfg=cfg)` applies, else a one-line reason naming the value at fault."""
  if isinstance(w, NF4Layer):
    w = jax.eval_shape(w.sliced)
  if not isinstance(w, NF4KMajor) or w.lead_shape:
    return f"W is a {type(w).__name__} with leading axes {getattr(w, 'lead_shape', None)}: one NF4KMajor [K, N] needed"
  k, n = w.shape
  if len(x_shape) != 2 or x_shape[1] != k or x_shape[0] < 1:
    return f"x of shape {tuple(x_shape)} for W [K={k}, N={n}]: [M >= 1, {k}] needed"
  if cfg.path not in PATHS or cfg.decode not in DECODES:
    return f"{cfg}: path one of {PATHS}, decode one of {DECODES}"
  if cfg.num_stages < 1 or cfg.num_warps < 1:
    return f"{cfg}: num_stages and num_warps must be >= 1"
  if n % cfg.bn or cfg.bn % 64:
    return f"N={n} is not a multiple of bn={cfg.bn} (a multiple of 64)"
  if cfg.bkb < 16 or cfg.bkb & (cfg.bkb - 1) or (k // 2) % (cfg.bkb * cfg.iters):
    return f"K/2={k // 2} is not a multiple of bkb * iters = {cfg.bkb} * {cfg.iters} (bkb a power of 2 >= 16)"
  if cfg.path == "fma" and x_shape[0] > 8:
    return f"M={x_shape[0]} rows on the fma path (at most 8)"
  if x_shape[0] > DOT_MAX_ROWS and cfg.path != "deq":
    return f"M={x_shape[0]} rows on the {cfg.path} path (at most DOT_MAX_ROWS={DOT_MAX_ROWS}; deq: any)"
  return None


def _decoder(decode: str, table_ref, shape, interpret: bool):
  """q -> NF4[q] for int32 codes in [0, 16) of `shape` (module docstring). "shfl": lane l of each warp holds
  NF4[l % 16] in one register, made once a program; code q reads lane q's register (`shfl.sync.idx`), one warp
  shuffle a code (H200, 8B MLP products at M = 1: 1.5x faster than the gather; RESULTS.md session_2026_11_29b).
  Interpreted, "shfl" is the table gather: the same values."""
  if decode == "select":
    return nf4_select
  if decode == "gather" or interpret:
    return lambda q: table_ref[q]
  from jax.experimental.pallas import triton as plgpu
  i32 = jax.ShapeDtypeStruct(shape, jnp.int32)
  asm = lambda code, *args: plgpu.elementwise_inline_asm(code, args=list(args), constraints="=r" + ",r" * len(args),
                                                         pack=1, result_shape_dtypes=[i32])[0]
  lane = asm("mov.u32 $0, %laneid;", jnp.zeros(shape, jnp.int32)) & 15
  reg = jnp.full(shape, table_ref[15])  # selects of scalars, not a gather: Triton remakes elementwise values in
  for e in range(15):                    # any layout it moves them to, where a moved load would carry another
    reg = jnp.where(lane == e, table_ref[e], reg)  # lane's entry (seen in a Triton probe: wrong values)
  reg = jax.lax.bitcast_convert_type(reg, jnp.int32)
  return lambda q: jax.lax.bitcast_convert_type(asm("shfl.sync.idx.b32 $0, $1, $2, 31, -1;", reg, q), jnp.float32)


def _kernel(xe_ref, xo_ref, codes_ref, se_ref, so_ref, table_ref, out_ref, *, cfg: KMajorConfig, rows: int,
            operand_dtype, interpret: bool):
  from jax.experimental import pallas as pl

  groups, bkb = cfg.bn // 64, cfg.bkb
  precision = jax.lax.Precision.HIGHEST if operand_dtype == jnp.float32 else None
  nf4 = _decoder(cfg.decode, table_ref, (64, bkb), interpret)

  def at(i):
    return i * bkb if isinstance(i, int) else pl.multiple_of(i * bkb, bkb)

  def step(i, accs):
    j0 = at(i)
    out = list(accs)
    if cfg.path == "dot_t":
      xe, xo = xe_ref[pl.ds(j0, bkb), :], xo_ref[pl.ds(j0, bkb), :]  # [bkb, rows]
    elif cfg.path == "dot":
      xe, xo = xe_ref[:, pl.ds(j0, bkb)], xo_ref[:, pl.ds(j0, bkb)]
    else:  # vectors [bkb]: broadcast over a tile's 64 outputs in the tile's own layout (no conversion)
      xe = [xe_ref[m, pl.ds(j0, bkb)].astype(jnp.float32) for m in range(rows)]
      xo = [xo_ref[m, pl.ds(j0, bkb)].astype(jnp.float32) for m in range(rows)]
    for g in range(groups):
      c = codes_ref[pl.ds(g * 64, 64), pl.ds(j0, bkb)].astype(jnp.int32)  # [64, bkb]
      hi, lo = nf4(c >> 4), nf4(c & 15)
      se, so = se_ref[g, pl.ds(j0, bkb)], so_ref[g, pl.ds(j0, bkb)]  # [bkb]
      if cfg.path != "fma":
        we, wo = (hi * se[None, :]).astype(operand_dtype), (lo * so[None, :]).astype(operand_dtype)
        if interpret and operand_dtype == jnp.bfloat16:  # XLA:CPU may keep the f32 values of a bf16 cast
          we, wo = (jax.lax.reduce_precision(v.astype(jnp.float32), 8, 7).astype(jnp.bfloat16) for v in (we, wo))
        mm = lambda a, b: jnp.dot(a.astype(operand_dtype), b.astype(operand_dtype),
                                  preferred_element_type=jnp.float32, precision=precision)
        if cfg.path == "dot_t":
          out[g] = out[g] + mm(we, xe) + mm(wo, xo)  # [64, rows]
        else:
          out[g] = out[g] + mm(xe, we.T) + mm(xo, wo.T)
        continue
      for m in range(rows):
        p = hi * (se * xe[m])[None, :] + lo * (so * xo[m])[None, :]
        out[g * rows + m] = out[g * rows + m] + p.sum(-1)
    return tuple(out)

  if cfg.path == "dot":
    zeros = tuple(jnp.zeros((rows, 64), jnp.float32) for _ in range(groups))
  elif cfg.path == "dot_t":
    zeros = tuple(jnp.zeros((64, rows), jnp.float32) for _ in range(groups))
  else:
    zeros = tuple(jnp.zeros((64,), jnp.float32) for _ in range(groups * rows))
  accs = step(0, zeros) if cfg.iters == 1 else jax.lax.fori_loop(0, cfg.iters, step, zeros)
  for g in range(groups):
    if cfg.path == "dot":
      out_ref[:, pl.ds(g * 64, 64)] = accs[g]
      continue
    if cfg.path == "dot_t":
      out_ref[pl.ds(g * 64, 64), :] = accs[g]
      continue
    for m in range(rows):
      out_ref[m, pl.ds(g * 64, 64)] = accs[g * rows + m]


def _weight_inputs(w: NF4KMajor | NF4Layer, cfg: KMajorConfig):
  """(in_specs, operands) of W's codes, even / odd scales and the NF4 table for a grid (N / bn, K / (2 bkb iters)):
  program (j, s) reads outputs j's codes and scales over K span s; an NF4Layer view's layer is read in place."""
  from jax.experimental import pallas as pl
  stacked, layer = (w.stacked, w.layer) if isinstance(w, NF4Layer) else (jax.tree.map(lambda a: a[None], w), 0)
  span = cfg.bkb * cfg.iters
  tile = pl.BlockSpec((None, cfg.bn, span), lambda j, s: (layer, j, s))
  scales = pl.BlockSpec((None, cfg.bn // 64, span), lambda j, s: (layer, j, s))
  return ([tile, scales, scales, pl.BlockSpec((16,), lambda j, s: (0,))],
          (stacked.codes, stacked.scale_even, stacked.scale_odd, jnp.asarray(NF4_CODE)))


def _compiler_params(cfg: KMajorConfig, interpret: bool):
  from jax.experimental.pallas import triton as plgpu
  return None if interpret else plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _planes_kernel(codes_ref, se_ref, so_ref, table_ref, we_ref, wo_ref, *, cfg: KMajorConfig, dtype,
                   interpret: bool):
  from jax.experimental import pallas as pl

  nf4 = _decoder(cfg.decode, table_ref, (64, cfg.bkb), interpret)
  for i in range(cfg.iters):
    cols = pl.ds(i * cfg.bkb, cfg.bkb)
    for g in range(cfg.bn // 64):
      rows = pl.ds(g * 64, 64)
      c = codes_ref[rows, cols].astype(jnp.int32)  # [64, bkb]
      we_ref[rows, cols] = (nf4(c >> 4) * se_ref[g, cols][None, :]).astype(dtype)
      wo_ref[rows, cols] = (nf4(c & 15) * so_ref[g, cols][None, :]).astype(dtype)


@functools.partial(jax.jit, static_argnames=("dtype", "cfg", "interpret"))
def dequantize_planes(w: NF4KMajor | NF4Layer, dtype=jnp.bfloat16, cfg: KMajorConfig | None = None,
                      interpret: bool = False) -> tuple[jnp.ndarray, jnp.ndarray]:
  """(We, Wo) [N, K/2] of `dtype`: We[n, j] = W[2 j, n], Wo[n, j] = W[2 j + 1, n] with W = w.dequantize(dtype),
  bit for bit; one Pallas kernel, grid (N / bn, K / (2 bkb iters)), cfg's bn / bkb / iters / decode / warps."""
  from jax.experimental import pallas as pl

  k, n = w.shape
  cfg = cfg or default_config(1, k, n)  # the fma default's tile, shrunk to fit K / 2
  reason = "no tile of >= 16 bytes divides K / 2" if cfg is None else unsupported_reason(
      (1, k), w, dataclasses.replace(cfg, path="deq"))
  if reason:
    raise ValueError(f"dequantize_planes: {reason}")
  span = cfg.bkb * cfg.iters
  in_specs, operands = _weight_inputs(w, cfg)
  out = pl.BlockSpec((cfg.bn, span), lambda j, s: (j, s))
  return tuple(pl.pallas_call(
      functools.partial(_planes_kernel, cfg=cfg, dtype=dtype, interpret=interpret),
      out_shape=[jax.ShapeDtypeStruct((n, k // 2), dtype)] * 2, grid=(n // cfg.bn, k // 2 // span),
      in_specs=in_specs, out_specs=[out, out], interpret=interpret, compiler_params=_compiler_params(cfg, interpret),
  )(*operands))


@functools.partial(jax.jit, static_argnames=("dtype", "cfg", "interpret"))
def kmajor_matmul(x: jnp.ndarray, w: NF4KMajor | NF4Layer, dtype=jnp.bfloat16, cfg: KMajorConfig | None = None,
                  interpret: bool = False) -> jnp.ndarray:
  """x [M, K] (bf16 or f32) @ w.dequantize(dtype) -> [M, N] of result_type(x, dtype) (module docstring).

  w: an NF4KMajor [K, N], or an `NF4Layer` view of a stacked one (layer i read in place). cfg: default
  `default_config(M, K, N)`; a product outside `unsupported_reason` raises ValueError. interpret=True runs
  Pallas' interpreter (any backend; for tests).
  """
  from jax.experimental import pallas as pl

  m = x.shape[0] if x.ndim == 2 else 0
  k, n = w.shape
  cfg = default_config(m, k, n) if cfg is None else cfg
  reason = "no configuration" if cfg is None else unsupported_reason(x.shape, w, cfg)
  if reason:
    raise ValueError(f"kmajor_matmul: {reason}")
  out_dtype = jnp.result_type(x.dtype, dtype)
  if cfg.path == "deq":
    we, wo = dequantize_planes(w, dtype, cfg, interpret)
    nt = lambda a, b: jax.lax.dot_general(a.astype(out_dtype), b.astype(out_dtype), (((1,), (1,)), ((), ())),
                                          preferred_element_type=jnp.float32)
    return (nt(x[:, 0::2], we) + nt(x[:, 1::2], wo)).astype(out_dtype)
  operand_dtype = jnp.float32 if out_dtype == jnp.float32 else jnp.bfloat16
  rows = max(16, 1 << (m - 1).bit_length()) if cfg.path != "fma" else m
  xp = jnp.pad(x, ((0, rows - m), (0, 0)))
  xe, xo = xp[:, 0::2], xp[:, 1::2]
  span = cfg.bkb * cfg.iters
  splits = k // 2 // span
  kernel = functools.partial(_kernel, cfg=cfg, rows=rows, operand_dtype=operand_dtype, interpret=interpret)
  transposed = cfg.path == "dot_t"
  if transposed:  # x^T [K/2, rows] in, y^T [N, rows] partials out
    xe, xo = xe.T, xo.T
    x_spec = pl.BlockSpec((span, rows), lambda j, s: (s, 0))
    out_shape, out_spec = (splits, n, rows), pl.BlockSpec((None, cfg.bn, rows), lambda j, s: (s, j, 0))
  else:
    x_spec = pl.BlockSpec((rows, span), lambda j, s: (0, s))
    out_shape, out_spec = (splits, rows, n), pl.BlockSpec((None, rows, cfg.bn), lambda j, s: (s, 0, j))
  w_specs, w_operands = _weight_inputs(w, cfg)
  partials = pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32), grid=(n // cfg.bn, splits),
      in_specs=[x_spec, x_spec, *w_specs], out_specs=out_spec, interpret=interpret,
      compiler_params=_compiler_params(cfg, interpret),
  )(xe, xo, *w_operands)
  y = partials.sum(0)
  return (y.T if transposed else y)[:m].astype(out_dtype)
