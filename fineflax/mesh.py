"""Device mesh with axes ("data", "fsdp", "model"): batches split over data and fsdp, large frozen weights
over "fsdp"; the generation engine's weights and KV pages over "model" (tensor parallelism,
`fineflax.engine.tensor_parallel`; size 1 unless asked for).

One device and many run the same jitted steps: arrays are placed with these shardings before the call
and XLA's sharding propagation does the rest (gradients of the replicated LoRA are all-reduced).
With several processes (`fineflax.train.distributed`) the mesh spans every process's devices; each
process passes the same global host array and places only its own shards (`put`).
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

BATCH_AXES = ("data", "fsdp")
MESH_AXES = (*BATCH_AXES, "model")


def make_mesh(data: int = -1, fsdp: int = 1, devices=None, model: int = 1) -> Mesh:
  """Mesh of shape (data, fsdp, model) over `devices` (default all); data = -1 takes what fsdp x model
  leaves."""
  devices = np.asarray(jax.devices() if devices is None else devices)
  if model < 1 or devices.size % model:
    raise ValueError(f"mesh: {devices.size} devices are not divisible by model={model}")
  return Mesh(devices.reshape(*mesh_shape(data, fsdp, devices.size // model), model), MESH_AXES)


def rollout_mesh(model: int, devices=None) -> Mesh | None:
  """The mesh tensor-parallel rollouts decode on: `devices` (default all) as data = D / model groups x a
  "model" axis of `model` devices (fsdp = 1); None for model = 1. ValueError when model does not divide the
  devices. With model < D, rows split over the groups, each one tensor-parallel engine
  (`fineflax.sampling.replicas`)."""
  devices = list(jax.devices() if devices is None else np.asarray(devices).flat)
  if model < 1 or len(devices) % model:
    raise ValueError(f"mesh: {len(devices)} devices are not divisible by model={model}")
  return None if model == 1 else make_mesh(data=-1, fsdp=1, devices=devices, model=model)


def mesh_shape(data: int, fsdp: int, n: int) -> tuple[int, int]:
  """(data, fsdp) of the mesh `make_mesh` builds over n devices (data = -1 takes what fsdp leaves);
  ValueError when they do not multiply to n."""
  if data == -1:
    if n % fsdp:
      raise ValueError(f"mesh: {n} devices are not divisible by fsdp={fsdp}")
    data = n // fsdp
  if data * fsdp != n:
    raise ValueError(f"mesh: data={data} x fsdp={fsdp} != {n} devices")
  return data, fsdp


def put(x, sharding: NamedSharding):
  """jax.device_put of one array; across processes, every process gives the same global host value `x`
  and places the shards of its own devices (jax.make_array_from_callback)."""
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def batch_sharding(mesh: Mesh, batch_axis: int = 0, ndim: int = 2) -> NamedSharding:
  """Split dimension `batch_axis` of an `ndim`-array over every device of the mesh."""
  spec = [None] * ndim
  spec[batch_axis] = BATCH_AXES
  return NamedSharding(mesh, P(*spec))


def shard_batch(batch: dict, mesh: Mesh, batch_axis: int = 0) -> dict:
  """device_put every array of `batch`, split along `batch_axis` (which must divide evenly)."""
  size = mesh.shape["data"] * mesh.shape["fsdp"]
  out = {}
  for k, v in batch.items():
    if v.shape[batch_axis] % size:
      raise ValueError(f"batch field {k!r}: dimension {batch_axis} = {v.shape[batch_axis]} is not "
                       f"divisible by the {size} devices of the mesh")
    out[k] = put(v, batch_sharding(mesh, batch_axis, v.ndim))
  return out


FROZEN_MIN_SHARD = 2 ** 16  # elements below which a frozen weight stays replicated (norms, biases)


def _fsdp_spec(x, fsdp: int, min_size: int = FROZEN_MIN_SHARD) -> P:
  """Shard the largest dimension divisible by `fsdp` (replicate arrays under `min_size` elements or
  indivisible ones)."""
  shape = getattr(x, "shape", ())
  if fsdp == 1 or np.prod(shape, dtype=np.int64) < min_size:
    return P()
  for d in sorted(range(len(shape)), key=lambda i: -shape[i]):
    if shape[d] % fsdp == 0:
      spec = [None] * len(shape)
      spec[d] = "fsdp"
      return P(*spec)
  return P()


def fsdp_shardings(tree, mesh: Mesh, min_size: int = FROZEN_MIN_SHARD):
  """The NamedSharding of each leaf of `tree` (arrays or shape structs): its largest dimension divisible
  by the mesh's "fsdp" size split over "fsdp"; leaves under `min_size` elements or indivisible replicated."""
  fsdp = mesh.shape["fsdp"]
  return jax.tree.map(lambda x: NamedSharding(mesh, _fsdp_spec(x, fsdp, min_size)), tree)


def shard_params(params, mesh: Mesh, min_size: int = FROZEN_MIN_SHARD):
  """device_put a parameter pytree by `fsdp_shardings`: big arrays split over "fsdp", the rest replicated.

  Quantised tensors are pytrees too; their array leaves (codes, scales) are placed the same way.
  Trainable full parameters pass min_size=0: every divisible array is split (no device holds a copy).
  """
  return jax.tree.map(put, params, fsdp_shardings(params, mesh, min_size))


def replicate(tree, mesh: Mesh):
  """device_put a pytree (LoRA, optimizer state) fully replicated over the mesh."""
  return jax.tree.map(lambda x: put(x, NamedSharding(mesh, P())), tree)
