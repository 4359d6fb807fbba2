"""Tensor-parallel decoding: the engine's weights, LoRA adapters and KV page pool split over a mesh's
"model" axis (Megatron layout), the decode / prefill programs partitioned by GSPMD from those shardings.

Layout over N = mesh.shape["model"] devices (`decode_param_specs`, `lora_specs`, `pool_sharding`):

  q, k, v, gate, up   kernel [.., in, out] split over out (columns: whole heads / intermediate units)
                      bias [.., out] split over out
  o, down             kernel [.., in, out] split over in (rows); bias replicated (added after the sum)
  embed [V, H]        split over V;  lm_head/kernel [H, V] split over V (tied: embed.T, the same split)
  norms, vectors      replicated
  LoRA                column linears: a replicated, b split over out; row linears: a split over in,
                      b replicated (per-row stacked adapters [.., A, in, R] / [.., A, R, out] alike)
  KV pool             [Hkv, L P, S, Dh] split over Hkv (dimension 0): each device holds its kv heads' pages

So a layer computes its own heads and intermediate units locally: one all-reduce after o (the attention
block) and one after down (the MLP block) per layer, plus the vocabulary-split embedding lookup and logits
(tests/test_engine_tensor_parallel.py counts them in the compiled HLO). Query head h uses kv head
h // (Hq / Hkv): splitting both head axes into N contiguous chunks keeps each group on one device.

The stacked ("scan") and the unrolled decoder layouts are covered: the unrolled one is prepared unfused
(`prepare_unrolled(fuse=False)`: per-linear [in, out] kernels) since a fused q|k|v kernel split over its
output axis would cut across the q / k / v boundary.

NF4 (QLoRA) kernels are split too, their codes and per-block scales (flat leaves [.., in out / 2] and
[.., in out / block]) along their last axis: for o / down (rows) a contiguous split of the row-major
tensor is a split by input rows as it is; q / k / v / gate / up are first re-ordered into column blocks
(`fineflax.quant.column_blocks`: a permutation of whole NF4 blocks, the same dequantised values), each
device's columns then one contiguous range. Nested (double-quantised) scale groups and offsets are
replicated (a few bytes a block group). int8 kernels are not split (a clear error). Placed, each NF4 kernel
is wrapped as a `fineflax.quant.sharded.ShardedNF4` (the mesh and its column / row split): its products run
the fused NF4 kernel on each device's shard under shard_map where `quant.matmul` picks the kernel, and
dequantise through GSPMD as before otherwise. With FINEFLAX_NF4_LAYOUT=kmajor (`quant.matmul.decode_layout`)
every NF4 kernel is instead laid out K-major (`quant.nf4_kmajor`, exact): codes [.., out, in / 2] and scales
[.., out / 64, in / 2] split over out (columns) or over in (rows), its shards multiplied by `nf4_kmajor_gemv`.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fineflax.mesh import put
from fineflax.models.paged import init_paged_cache
from fineflax.quant.column_blocks import ColumnBlocks, column_blocks
from fineflax.quant.matmul import decode_layout
from fineflax.quant.nf4 import NF4Tensor
from fineflax.quant.nf4_kmajor import NF4KMajor, from_nf4, kmajor_reason
from fineflax.quant.sharded import ShardedNF4

MODEL_AXIS = "model"
COLUMN = ("q", "k", "v", "gate", "up")  # split over their output axis
ROW = ("o", "down")  # split over their input axis


def tp_size(mesh: Mesh | None) -> int:
  """Devices of the mesh's "model" axis (1 without a mesh or without that axis)."""
  if mesh is None or MODEL_AXIS not in mesh.shape:
    return 1
  return int(mesh.shape[MODEL_AXIS])


def check_tp(config, n: int) -> None:
  """ValueError naming the field when the model cannot be split over n devices: attention heads, kv heads
  and the intermediate size must be divisible by n."""
  if n <= 1:
    return
  for field, value in (("num_heads", config.num_heads), ("num_kv_heads", config.num_kv_heads),
                       ("intermediate_size", config.intermediate_size)):
    if value % n:
      raise ValueError(f"tensor parallelism over {n} devices: config.{field}={value} is not divisible by {n}")


def _quantized(x) -> bool:
  return hasattr(x, "dequantize")


def tp_layout(params, n: int, mesh: Mesh | None = None):
  """Decode params with every NF4 column kernel (q / k / v / gate / up) as column blocks for n devices
  (`quant.column_blocks`, exact); dense and row kernels unchanged. ValueError for other quantised kernels.
  With `mesh`, each kernel's blocks are made by one jitted call whose output is split over its "model" axis
  (a kernel split over other devices, e.g. the update's fsdp, is re-laid out without a host copy)."""
  def convert(path, x):
    if isinstance(x, ShardedNF4):  # done already (laid out, placed and wrapped by shard_decode_params)
      if x.n != n:
        raise ValueError(f"tensor parallelism over {n} devices: the NF4 kernel of {_linear(_keys(path))!r} is "
                         f"already split over {x.n}")
      return x
    if not _quantized(x) or isinstance(x, NF4KMajor) or (isinstance(x, ColumnBlocks) and x.blocks.shape[0] == n):
      return x  # done already
    name = _linear(_keys(path))
    if not isinstance(x, NF4Tensor):
      raise ValueError(f"tensor parallelism: the {type(x).__name__} kernel of {name!r} is not split over the "
                       "model axis (NF4 and dense are); decode a dense base (dense_base=True)")
    if kmajor and name in COLUMN + ROW:
      if reason := kmajor_reason(x):
        raise ValueError(f"tensor parallelism, NF4 kernel of {name!r}: {reason}")
      return _made_on(from_nf4, x, n, mesh, -2 if name in COLUMN else -1)
    if name not in COLUMN or n == 1:
      return x
    try:
      return _made_on(functools.partial(column_blocks, n=n), x, n, mesh, -1)
    except ValueError as e:
      raise ValueError(f"tensor parallelism, NF4 kernel of {name!r}: {e}") from None
  kmajor = decode_layout(tensor_parallel=True) == "kmajor"
  return jax.tree_util.tree_map_with_path(convert, params, is_leaf=_quantized)


def _made_on(make, w: NF4Tensor, n: int, mesh: Mesh | None, axis: int):
  """make(w) (`column_blocks` or `from_nf4`); with a mesh (one process), made by one jitted call whose every
  output leaf is split over the "model" axis along `axis` (w's own leaves moved there first, split along their
  last axis, when they live elsewhere)."""
  if mesh is None or jax.process_count() > 1:
    return make(w)
  split = lambda axis: lambda x: NamedSharding(mesh, _spec(np.shape(x), axis, n))
  mesh_devices = set(mesh.devices.flat)
  if any(getattr(x, "sharding", None) is None or x.sharding.device_set != mesh_devices for x in jax.tree.leaves(w)):
    w = jax.tree.map(lambda x: put(x, split(-1)(x)), w)  # other devices (e.g. the update's whole mesh): move first
  return jax.jit(make, out_shardings=jax.tree.map(split(axis), jax.eval_shape(make, w)))(w)


def _linear(path: tuple[str, ...]) -> str | None:
  """The linear (q, k, ..., down) a parameter path belongs to, if any."""
  return next((k for k in path if k in COLUMN or k in ROW), None)


def _spec(shape, axis: int | None, n: int) -> P:
  """PartitionSpec of an array of `shape` split over "model" along `axis` (negative: from the end); None, or
  a dimension not divisible by n: replicated."""
  ndim = len(shape)
  if axis is None or shape[axis] % n:
    return P()
  spec = [None] * ndim
  spec[axis] = MODEL_AXIS
  return P(*spec)


def _leaf_axis(path: tuple[str, ...], vocab_split: bool) -> int | None:
  """The split axis of the decode parameter at `path` (dict keys from the root), see the module docstring."""
  name, leaf = (path[-2], path[-1]) if len(path) >= 2 else (None, path[-1])
  if "kernel" in path[:-1] and _linear(path):  # a leaf of a quantised kernel: flat codes / block scales
    return -1 if leaf in ("codes", "absmax") else None
  if path[0] == "embed":
    return 0 if vocab_split else None
  if path[0] == "lm_head":
    return -1 if vocab_split else None
  if name in COLUMN and leaf in ("kernel", "bias"):
    return -1
  if name in ROW and leaf == "kernel":
    return -2
  return None


def _keys(path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def decode_param_specs(params, config, n: int):
  """PartitionSpec of every leaf of decode params (stacked `decoder` layout or unfused `prepare_unrolled`); a
  K-major NF4 kernel's leaves split over out (column linears: axis -2) or in (row linears: axis -1)."""
  vocab_split = config.vocab_size % n == 0

  def spec(path, x):
    keys = _keys(path)
    if isinstance(x, NF4KMajor):
      axis = -2 if _linear(keys) in COLUMN else -1
      return jax.tree.map(lambda leaf: _spec(np.shape(leaf), axis, n), x)
    return _spec(np.shape(x), _leaf_axis(keys, vocab_split), n)
  return jax.tree_util.tree_map_with_path(spec, params, is_leaf=lambda x: isinstance(x, NF4KMajor))


def lora_specs(lora, n: int):
  """PartitionSpec of every leaf of LoRA adapters {name: {"a", "b"}} (one or stacked per-row adapters)."""
  def spec(path, x):
    name, leaf = _keys(path)[-2:]
    axis = -1 if (name in COLUMN and leaf == "b") else -2 if (name in ROW and leaf == "a") else None
    return _spec(np.shape(x), axis, n)
  return None if lora is None else jax.tree_util.tree_map_with_path(spec, lora)


def place(tree, specs, mesh: Mesh):
  """Every leaf of `tree` placed with NamedSharding(mesh, its spec) (`fineflax.mesh.put`); a leaf whose
  shards on the mesh's devices are already the ones that sharding asks for (e.g. a copy per tensor-parallel
  group, laid out over a larger data x model mesh) is re-assembled from them, without a copy (`reuse_shards`)."""
  def one(x, s):
    sharding = NamedSharding(mesh, s)
    reused = reuse_shards(x, sharding)
    return put(x, sharding) if reused is None else reused
  return jax.tree.map(one, tree, specs)


def reuse_shards(x, sharding: NamedSharding):
  """`x` as an array of `sharding` built from the device buffers it already has (no copy) when, on every
  device of `sharding`, x holds exactly the slice that sharding puts there; None otherwise (one process)."""
  if not isinstance(x, jax.Array) or jax.process_count() > 1 or x.sharding == sharding:
    return None
  have = {s.device: s for s in x.addressable_shards}
  want = sharding.devices_indices_map(x.shape)
  bounds = lambda index: tuple(sl.indices(n)[:2] for sl, n in zip(index, x.shape))
  if any(d not in have or bounds(have[d].index) != bounds(idx) for d, idx in want.items()):
    return None
  return jax.make_array_from_single_device_arrays(x.shape, sharding, [have[d].data for d in want])


def shard_decode_params(params, config, mesh: Mesh):
  """Decode params placed on the mesh in the Megatron layout (`tp_layout`, `decode_param_specs`)."""
  n = tp_size(mesh)
  check_tp(config, n)
  params = tp_layout(params, n, mesh)
  fused = [g for layer in (params["layers"] if isinstance(params["layers"], list) else [])
           for g in ("qkv", "gate_up") if g in layer]
  if fused:
    raise ValueError(f"tensor parallelism: decode params hold fused groups {sorted(set(fused))}; prepare "
                     "them with prepare_decode_params(..., fuse=False)")
  return wrap_sharded(place(params, decode_param_specs(params, config, n), mesh), mesh)


def wrap_sharded(params, mesh: Mesh):
  """Placed decode params with each split NF4 kernel as a `ShardedNF4` (column blocks of q / k / v / gate /
  up: "column"; NF4 o / down: "row"; K-major kernels by their linear); other leaves, and kernels already
  wrapped, unchanged."""
  n = tp_size(mesh)

  def wrap(path, x):
    name = _linear(_keys(path))
    if isinstance(x, ColumnBlocks) and name in COLUMN and x.blocks.shape[0] == n:
      return ShardedNF4(x, mesh, "column", MODEL_AXIS)
    if isinstance(x, NF4Tensor) and name in ROW:
      return ShardedNF4(x, mesh, "row", MODEL_AXIS)
    if isinstance(x, NF4KMajor) and name in COLUMN + ROW:
      return ShardedNF4(x, mesh, "column" if name in COLUMN else "row", MODEL_AXIS)
    return x
  return jax.tree_util.tree_map_with_path(wrap, params, is_leaf=_quantized)


def shard_lora(lora, mesh: Mesh):
  """LoRA adapters placed to match their base linears (`lora_specs`)."""
  return None if lora is None else place(lora, lora_specs(lora, tp_size(mesh)), mesh)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def pool_sharding(mesh: Mesh) -> NamedSharding:
  """The KV page pools [Hkv, L P, S, Dh] split over their kv heads."""
  return NamedSharding(mesh, P(MODEL_AXIS))


def new_pool(config, num_pages: int, page_size: int, dtype, mesh: Mesh) -> dict:
  """Zero pools created split over kv heads on the mesh (no device ever holds the whole pool)."""
  make = jax.jit(functools.partial(init_paged_cache, config, num_pages, page_size, dtype),
                 out_shardings=pool_sharding(mesh))
  return make()


def random_decode_params(config, mesh: Mesh, dtype=jnp.bfloat16, impl: str = "scan", quant: str = "none",
                         seed: int = 0, std: float = 0.02):
  """Random decode params of `config` in the layout `Engine(impl=impl, mesh=mesh, prepared=True)` reads
  (stacked for "scan", unfused per layer for "unrolled"; quant="nf4": the linears NF4 as
  `models.quantize.quantize_params` makes them, in the split layout of `tp_layout`): N(0, std) floating
  leaves, random NF4 codes, unit norms, each leaf created by a jitted call directly in its split layout
  (each device computes only its shards: a model larger than one device never exists whole anywhere)."""
  from fineflax.engine.decode import prepare_decode_params
  from fineflax.models.decoder import init_params
  from fineflax.models.quantize import quantize_params
  n = tp_size(mesh)

  def layout(p):
    p = quantize_params(p, kind=quant) if quant != "none" else p
    return tp_layout(prepare_decode_params(p, config, impl, dtype, fuse=False), n)
  shapes = jax.eval_shape(lambda: layout(init_params(config, jax.random.PRNGKey(0), dtype)))
  specs = decode_param_specs(shapes, config, n)
  unit = 1.0 - config.norm_offset

  @functools.lru_cache(maxsize=None)
  def maker(shape, dt, spec, norm):
    def make(key):
      if norm:
        return jnp.full(shape, unit, dt)
      if not jnp.issubdtype(dt, jnp.floating):  # quantised codes
        return jax.random.bits(key, shape, jnp.uint8).astype(dt)
      return (std * jax.random.normal(key, shape, jnp.float32)).astype(dt)
    return jax.jit(make, out_shardings=NamedSharding(mesh, spec))

  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  spec_leaves = treedef.flatten_up_to(specs)
  key = jax.random.PRNGKey(seed)
  out = [maker(tuple(x.shape), jnp.dtype(x.dtype), spec, "norm" in "/".join(_keys(path)))(jax.random.fold_in(key, i))
         for i, ((path, x), spec) in enumerate(zip(leaves, spec_leaves))]
  return jax.tree.unflatten(treedef, out)


def bytes_per_device(tree) -> dict:
  """{device: bytes of `tree`'s shards it holds}."""
  out: dict = {}
  for x in jax.tree.leaves(tree):
    for shard in x.addressable_shards:
      out[shard.device] = out.get(shard.device, 0) + shard.data.nbytes
  return out


def constrain(tree, sharding):
  """`tree` with every leaf constrained to `sharding` inside a jitted function (unchanged for None)."""
  if sharding is None:
    return tree
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), tree)
