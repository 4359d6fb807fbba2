"""The paged engine on a mesh of several devices of one process: rows split over its replicas, one engine
each. A replica is one device (cache="replicas" on a mesh without a "model" axis) or one tensor-parallel
group (a mesh of D devices with a "model" axis of M, 1 < M < D, cache "paged" or "replicas": its D / M
groups of M devices, each a model-only sub-mesh decoding tensor-parallel, `engine.tensor_parallel`).

Each replica holds a full copy of the decode weights (a device: the mesh's sharded params gathered onto
it; a group: split over its M devices in the Megatron layout, the shards reused where the params are laid
out so already, as the learner's rollout copy on the data x model mesh is) and its own page pool; its rows'
KV pages live only there, so per-device KV memory is that of its rows. Rows are assigned whole groups of
identical prompts at a time (a GRPO group shares its prompt pages), largest groups first, to the replica
with the least work so far (rows x (prompt + budget) tokens). Row r samples with key fold_in(rng, r), r its
index in the whole batch, so the result equals the one-device run token for token, sampled or greedy. The
replicas decode at once: one host thread drives each engine (the device waits release the GIL), inside
`jax.default_device` of the replica's first device. Weights are placed on every replica in the calling
thread before the threads start (jax's gather of a sharded array from several threads at once is not safe).

A mesh spanning several processes keeps the static-cache session (`static_session`): its devices are not
all addressable from one host thread.
"""
from __future__ import annotations

import concurrent.futures
from typing import Callable, Sequence

import jax
from jax.sharding import Mesh

from fineflax.engine import tensor_parallel as tp
from fineflax.engine.prompts import checked_appends, group_identical
from fineflax.mesh import MESH_AXES


def replicas_of(cache: str, mesh) -> list | None:
  """The replicas rows are split over (module docstring) on a mesh of several devices of one process:
  cache="replicas" without a model axis: its devices; cache "paged" or "replicas" with a model axis of
  1 < M < the devices: its tensor-parallel groups, model-only sub-meshes over the M devices that share the
  other axes' indices. None otherwise (one device, no mesh, a model-only mesh, several processes)."""
  if mesh is None or mesh.devices.size < 2 or jax.process_count() > 1:
    return None
  m = tp.tp_size(mesh)
  if m == 1:
    return list(mesh.devices.flat) if cache == "replicas" else None
  if cache not in ("paged", "replicas") or mesh.devices.size == m:
    return None
  groups = mesh.devices.reshape(-1, m) if mesh.axis_names[-1] == tp.MODEL_AXIS else None
  if groups is None:
    raise ValueError(f"mesh axes {mesh.axis_names}: the model axis must be the last (fineflax.mesh.make_mesh)")
  return [Mesh(g.reshape(1, 1, m), MESH_AXES) for g in groups]


def first_device(replica):
  """The device a replica's thread runs under (a group: its first device)."""
  mesh = replica_mesh(replica)
  return replica if mesh is None else mesh.devices.flat[0]


def replica_mesh(replica):
  """The model-only mesh a replica's engine decodes tensor-parallel on (a group); None for a device."""
  return replica if isinstance(replica, Mesh) else None


def assign_rows(prompts: Sequence[Sequence[int]], n: int, budget: int) -> list[list[int]]:
  """Row indices per replica (each list ascending): groups of identical prompts kept whole, placed largest
  first (ties: first appearance) on the replica with the least work, work = rows x (prompt + budget)."""
  groups = group_identical(prompts)
  work = lambda g: len(g) * (len(prompts[g[0]]) + budget)
  parts, load = [[] for _ in range(n)], [0] * n
  for g in sorted(groups, key=lambda g: (-work(g), g[0])):
    d = min(range(n), key=lambda i: (load[i], i))
    parts[d] += g
    load[d] += work(g)
  return [sorted(p) for p in parts]


def on_devices(replicas, fn: Callable, parts: Sequence) -> list:
  """[fn(replica, part) for each replica], one thread each, inside `jax.default_device` of its first device."""
  def run(r, part):
    with jax.default_device(first_device(r)):
      return fn(r, part)
  with concurrent.futures.ThreadPoolExecutor(len(replicas)) as pool:
    return list(pool.map(run, replicas, parts))


def place(tree, replica):
  """`tree` with every array on `replica`: a device (a sharded array is gathered) or replicated over a
  group's devices; None stays None."""
  if tree is None:
    return None
  return jax.device_put(tree, tp.replicated(replica) if isinstance(replica, Mesh) else replica)


def place_weights(params, lora, config, replica) -> tuple:
  """(params, lora) on a replica: on a device whole (`place`); on a group split over its model axis in the
  Megatron layout (`tensor_parallel.decode_param_specs`, `lora_specs`; the engine finishes NF4 column
  blocks on the group), shards the params hold there already reused without a copy."""
  if not isinstance(replica, Mesh):
    return place(params, replica), place(lora, replica)
  n = tp.tp_size(replica)
  return tp.place(params, tp.decode_param_specs(params, config, n), replica), tp.shard_lora(lora, replica)


def place_replica(params, lora, rng, config, replica) -> tuple:
  """(params, lora, rng) on a replica: what its engine reads (`place_weights`, `place`)."""
  return (*place_weights(params, lora, config, replica), place(rng, replica))


class ReplicaSession:
  """`SamplerSession`'s start / append / decode / result over rows split across `replicas` (module
  docstring); `place(replica)` -> the weights placed on it (called in the calling thread, one replica after
  another), `make(replica, *placed)` builds the session of a replica (in its thread)."""

  def __init__(self, replicas, make: Callable, place: Callable, max_total_len: int, vocab_size: int):
    self.replicas, self.make, self.place, self.max_total_len = list(replicas), make, place, int(max_total_len)
    self.vocab_size = int(vocab_size)
    self.sessions, self.used, self.where, self.num_rows = [], [], {}, 0

  def start(self, prompts) -> None:
    prompts = [list(p) for p in prompts]
    used = [(r, p) for r, p in zip(self.replicas, assign_rows(prompts, len(self.replicas), self.max_total_len))
            if p]

    # Copies are made here, one replica after another: jax's gather of a sharded array onto one device
    # is not safe from several threads at once (CI saw safe_zip length mismatches).
    placed = {r: self.place(r) for r, _ in used}

    def start_one(replica, rows):
      s = self.make(replica, *placed[replica])
      s.start([prompts[r] for r in rows], row_ids=rows)
      return s
    self.used = [r for r, _ in used]
    self.sessions = on_devices(self.used, start_one, [p for _, p in used])
    self.where = {r: (i, j) for i, (_, part) in enumerate(used) for j, r in enumerate(part)}
    self.num_rows = len(prompts)

  def append(self, tokens) -> None:
    per = [{} for _ in self._started()]
    for r, toks in checked_appends(tokens, self.num_rows, self.vocab_size).items():
      i, j = self.where[r]
      per[i][j] = toks
    for s, t in zip(self.sessions, per):
      if t:
        s.append(t)

  def decode(self, max_new_tokens: int, stop_strings: Sequence[str] = ()) -> None:
    on_devices(self.used, lambda d, s: s.decode(max_new_tokens, stop_strings), self._started())

  def rows(self) -> list:
    """The engine sequences of every row, in the batch's order."""
    sessions = self._started()
    return [sessions[i].rows[j] for i, j in (self.where[r] for r in range(self.num_rows))]

  def _started(self) -> list:
    if not self.sessions:
      raise RuntimeError("call start(prompts) first")
    return self.sessions
