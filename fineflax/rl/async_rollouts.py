"""Asynchronous RL (`rl.async_steps` = k >= 1): batch t + k is generated while the learner trains on batch t.

Versions: the weights after v updates are version v; step t starts from version t - 1. Batch s is generated
from the weights a step starts from: the first RL step s0 generates batches s0 .. s0 + k - 1 from version
s0 - 1 (before its update), and every step t then launches batch t + k from version t - 1 (when t + k <=
num_steps) and updates on batch t. So the update at step t reads rollouts of version max(t - 1 - k, s0 - 1):
at most k updates old (staleness (t - 1) - version <= k); with k = 1, step t's rollouts come from the
weights step t - 1 started from (verl's one-step-off-policy). The order within a step is fixed: the replay
buffer records batch t (ExGRPO), batch t + k is launched, the update runs, then batch t + k is joined; the
same on every device layout, so runs are deterministic. Each batch carries its version; the importance
weights of `rl.importance` (`fineflax.rl.importance`) then correct both the staleness and the engine /
learner mismatch, pi_old / pi_rollout on the batch's tokens.

Devices: with `config.mesh.rollout` = R > 0 the last R devices form the rollout group and the others the
learner's mesh (`split_devices`): the frozen base is copied to the group once, the trainable params
(LoRA mode: the adapters only; full training: the whole model) go device to device (`jax.device_put`, no
host copy) after each update, and batch t + k decodes there in a thread while the learner trains. With
R = 0 rollouts decode on the learner's devices, one after the other with the updates (the CPU test path,
the same semantics).

Checkpoints: the in-flight batches (steps t + 1 .. t + k after step t, each with its version) and the
staleness histogram are saved in the checkpoint's JSON meta (`state_dict`: the batches pickled, base64; the
run's own files), so a resumed run updates on exactly the batches the interrupted one would have.
Metrics per step: policy_version, staleness, staleness_hist_j (steps so far whose batch was j updates
old, j = 0 .. k), time_rollout_s (the batch's own generation), time_wait_s (the update waiting for the
next batch's generation).
"""
from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import pickle
import time
from typing import Callable

import jax
import numpy as np

from fineflax.config_checks import ConfigError
from fineflax.mesh import make_mesh, replicate, shard_params


@dataclasses.dataclass
class Batch:
  """One rollout batch in flight: the step whose update reads it, the policy version that generated it, its
  scored groups (`fineflax.rl.collect.Groups`) and its generation's wall time."""
  step: int
  version: int
  groups: object
  time_s: float


def split_devices(config, devices=None) -> tuple[list, list | None]:
  """(learner devices, rollout devices or None) of config.mesh.rollout = R (0: None, every device is the
  learner's): the last R of `devices` (default all) are the rollout group. ConfigError naming the value at
  fault: R < 0, R leaving no learner device, R > 0 without rl.async_steps, with tensor-parallel rollouts
  (mesh.model > 1) or several processes."""
  devices = list(jax.devices() if devices is None else devices)
  r = config.mesh.get("rollout", 0)
  if not isinstance(r, int) or isinstance(r, bool) or r < 0:
    raise ConfigError(f"config.mesh.rollout={r!r}: an integer >= 0 (devices of the rollout group; 0 = none)")
  if r == 0:
    return devices, None
  if not config.rl.get("async_steps", 0):
    raise ConfigError(f"config.mesh.rollout={r}: a rollout group needs config.rl.async_steps >= 1")
  if r >= len(devices):
    raise ConfigError(f"config.mesh.rollout={r}: leaves no learner device of the {len(devices)}")
  if int(config.mesh.get("model", 1)) > 1 or jax.process_count() > 1:
    raise ConfigError(f"config.mesh.rollout={r}: a rollout group runs in one process without tensor-parallel "
                      f"rollouts (config.mesh.model={config.mesh.get('model', 1)}, {jax.process_count()} processes)")
  return devices[:-r], devices[-r:]


class RolloutGroup:
  """The rollout devices of an async run: the learner's frozen base copied there once (LoRA mode), each
  version's trainable params copied there by `sync`, the policy that decodes there, and one worker thread
  whose JAX default device is the group's first."""

  def __init__(self, learner, devices):
    self.learner, self.devices = learner, list(devices)
    self.mesh = make_mesh(data=-1, fsdp=1, devices=self.devices)
    self.base = None if learner.base is None else shard_params(learner.base, self.mesh)  # fsdp 1: replicated
    self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fineflax-rollouts")

  def sync(self, params):
    """`params` (the learner's trainable pytree) copied device to device onto the group, replicated."""
    return replicate(params, self.mesh)

  def policy(self, params):
    """The learner's policy of the copied `params`, reading the group's base, rows over the group."""
    p = self.learner.policy(params)
    return dataclasses.replace(p, base=params if self.base is None else self.base,
                               mesh=self.mesh if len(self.devices) > 1 else None)

  def entropy_fn(self, params):
    return lambda prompt, trajectories: self.learner.mean_entropy(params, prompt, trajectories, base=self.base)

  def submit(self, fn: Callable) -> concurrent.futures.Future:
    def run():
      with jax.default_device(self.devices[0]):
        return fn()
    return self.pool.submit(run)


class _Done:
  """A finished `Future`'s result(): the one-device path runs the generation in place."""

  def __init__(self, value):
    self.value = value

  def result(self):
    return self.value


class AsyncRollouts:
  """The in-flight batches of an async run (module docstring).

  collect(params, step, policy, entropy_fn) -> Groups: batch `step` of the job (its questions and rng),
  under the learner's trainable `params` (policy / entropy_fn None) or a rollout group's policy."""

  def __init__(self, k: int, num_steps: int, collect: Callable, group: RolloutGroup | None = None):
    self.k, self.num_steps, self.collect, self.group = int(k), int(num_steps), collect, group
    self.queue: list[Batch] = []
    self.hist = np.zeros(self.k + 1, np.int64)

  def _generate(self, params, step: int, version: int):
    """A future of Batch `step` generated from `params`, the learner's weights of `version`."""
    if self.group is None:
      t0 = time.time()
      return _Done(Batch(step, version, self.collect(params, step, None, None), time.time() - t0))
    placed = self.group.sync(params)

    def run():
      t0 = time.time()
      g = self.collect(placed, step, self.group.policy(placed), self.group.entropy_fn(placed))
      return Batch(step, version, g, time.time() - t0)
    return self.group.submit(run)

  def step(self, state, step: int, record: Callable, update: Callable):
    """One async step from `state` (version step - 1): batch `step` (the first RL step prefills k batches),
    record(groups) (the replay buffer), batch step + k launched, update(state, groups) -> (state, metrics),
    the launched batch joined -> (new state, metrics with the async ones)."""
    version = step - 1
    if not self.queue:  # the first RL step (or a checkpoint without batches): k batches from this version
      self.queue = [self._generate(state["params"], s, version).result()
                    for s in range(step, min(step + self.k, self.num_steps + 1))]
    batch = self.queue.pop(0)
    if batch.step != step:
      raise RuntimeError(f"async rollouts: step {step} found batch {batch.step} first in the queue")
    record(batch.groups)
    nxt = step + self.k
    future = self._generate(state["params"], nxt, version) if nxt <= self.num_steps else None
    t0 = time.time()
    state, metrics = update(state, batch.groups)
    t_update = time.time() - t0
    if future is not None:
      self.queue.append(future.result())
    staleness = version - batch.version
    self.hist[staleness] += 1
    return state, {**metrics, "policy_version": float(batch.version), "staleness": float(staleness),
                   **{f"staleness_hist_{j}": float(n) for j, n in enumerate(self.hist)},
                   "time_rollout_s": batch.time_s, "time_update_s": t_update,
                   "time_wait_s": time.time() - t0 - t_update}

  def state_dict(self) -> dict:
    """JSON-able: the in-flight batches (pickled, base64) and the staleness histogram."""
    return {"batches": base64.b64encode(pickle.dumps(self.queue)).decode("ascii"), "hist": self.hist.tolist()}

  def load_state_dict(self, d: dict) -> None:
    self.queue = pickle.loads(base64.b64decode(d["batches"]))
    self.hist = np.asarray(d["hist"], np.int64)
