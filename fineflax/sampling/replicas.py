"""The paged engine on a mesh of several devices of one process (cache="replicas" of `generate` and
`SamplerSession`; opt-in): rows split over the devices, one engine each.

Each device holds a full copy of the decode weights (the mesh's sharded params gathered onto it once a
session) and its own page pool; its rows' KV pages live only there, so per-device KV memory is that of its
rows. Rows are assigned whole groups of identical prompts at a time (a GRPO group shares its prompt pages),
largest groups first, to the device with the least work so far (rows x (prompt + budget) tokens). Row r
samples with key fold_in(rng, r), r its index in the whole batch, so the result equals the one-device run
token for token, sampled or greedy. The devices decode at once: one host thread drives each engine (the
device waits release the GIL), inside `jax.default_device` of its device.

A mesh spanning several processes keeps the static-cache session (`static_session`): its devices are not
all addressable from one host thread.
"""
from __future__ import annotations

import concurrent.futures
from typing import Callable, Sequence

import jax

from fineflax.engine.prompts import checked_appends, group_identical


def replica_devices(mesh) -> list | None:
  """The devices rows are split over: every device of a mesh of several devices in one process; None
  (one device, no mesh, or several processes)."""
  if mesh is None or mesh.devices.size < 2 or jax.process_count() > 1:
    return None
  return list(mesh.devices.flat)


def assign_rows(prompts: Sequence[Sequence[int]], n: int, budget: int) -> list[list[int]]:
  """Row indices per device (each list ascending): groups of identical prompts kept whole, placed largest
  first (ties: first appearance) on the device with the least work, work = rows x (prompt + budget)."""
  groups = group_identical(prompts)
  work = lambda g: len(g) * (len(prompts[g[0]]) + budget)
  parts, load = [[] for _ in range(n)], [0] * n
  for g in sorted(groups, key=lambda g: (-work(g), g[0])):
    d = min(range(n), key=lambda i: (load[i], i))
    parts[d] += g
    load[d] += work(g)
  return [sorted(p) for p in parts]


def on_devices(devices, fn: Callable, parts: Sequence) -> list:
  """[fn(device, part) for each device], one thread each, inside `jax.default_device(device)`."""
  def run(d, part):
    with jax.default_device(d):
      return fn(d, part)
  with concurrent.futures.ThreadPoolExecutor(len(devices)) as pool:
    return list(pool.map(run, devices, parts))


def place(tree, device):
  """`tree` with every array on `device` (a sharded array is gathered; None stays None)."""
  return None if tree is None else jax.device_put(tree, device)


class ReplicaSession:
  """`SamplerSession`'s start / append / decode / result over rows split across `devices` (module
  docstring); `make(device, params, lora)` builds the one-device session of a device."""

  def __init__(self, devices, make: Callable, params, lora, max_total_len: int, vocab_size: int):
    self.devices, self.make, self.max_total_len = list(devices), make, int(max_total_len)
    self.params, self.lora, self.vocab_size = params, lora, int(vocab_size)
    self.sessions, self.used, self.where, self.num_rows = [], [], {}, 0

  def start(self, prompts) -> None:
    prompts = [list(p) for p in prompts]
    used = [(d, p) for d, p in zip(self.devices, assign_rows(prompts, len(self.devices), self.max_total_len))
            if p]

    # Copies are made here, one device after another: jax's gather of a sharded array onto one device
    # is not safe from several threads at once (CI saw safe_zip length mismatches).
    placed = {d: (place(self.params, d), place(self.lora, d)) for d, _ in used}

    def start_one(d, rows):
      s = self.make(d, *placed[d])
      s.start([prompts[r] for r in rows], row_ids=rows)
      return s
    self.used = [d for d, _ in used]
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
