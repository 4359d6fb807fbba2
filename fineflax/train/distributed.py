"""Multi-process runs: `jax.distributed.initialize` from `config.distributed`, and who writes files.

  config.distributed.coordinator_address  "host:port" of process 0 ("" = from the environment)
  config.distributed.num_processes        number of processes (0 = from the environment)
  config.distributed.process_id           this process's index (-1 = from the environment)

With every field unset, JAX's own cluster detection decides (SLURM: SLURM_JOB_ID and SLURM_NTASKS > 1;
Open MPI; Kubernetes/GKE TPU pods), and without a cluster the run is one process. The call must come
before anything touches a device (launch.py does it first). After it, `jax.devices()` lists every
process's devices, the mesh spans them all, and each process places its own shards of the same global
arrays (`fineflax.mesh.put`). Only process 0 writes metrics, history, summaries, configs and
adapters (`is_writer`); orbax checkpoints are written by all processes together.
"""
from __future__ import annotations

import logging
import os

import jax

_SLURM_MULTI = lambda env: "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", "1") or 1) > 1


def settings(cfg, env=None) -> dict | None:
  """kwargs of `jax.distributed.initialize`, {} to let JAX read the cluster's environment, or None for a
  single-process run. Half-set fields are an error naming the field."""
  from fineflax.config_checks import ConfigError
  env = os.environ if env is None else env
  addr = (cfg.get("coordinator_address", "") if cfg else "") or ""
  n = int(cfg.get("num_processes", 0) if cfg else 0)
  pid = int(cfg.get("process_id", -1) if cfg else -1)
  if addr or n or pid >= 0:
    missing = [k for k, unset in (("coordinator_address", not addr), ("num_processes", n < 1),
                                  ("process_id", pid < 0)) if unset]
    if missing:
      raise ConfigError(f"config.distributed: set {', '.join('distributed.' + m for m in missing)} too "
                        f"(coordinator_address={addr!r}, num_processes={n}, process_id={pid}), "
                        "or leave all three unset to read them from the environment")
    if pid >= n:
      raise ConfigError(f"config.distributed.process_id={pid} must be < num_processes={n}")
    return {"coordinator_address": addr, "num_processes": n, "process_id": pid}
  if _SLURM_MULTI(env) or "JAX_COORDINATOR_ADDRESS" in env or "OMPI_COMM_WORLD_SIZE" in env:
    return {}
  return None


def initialize(cfg) -> bool:
  """Join the run's processes (see the module docstring); True when this is a multi-process run."""
  kwargs = settings(cfg)
  if kwargs is None:
    return False
  try:  # CPU processes exchange arrays through gloo (GPUs use NCCL whatever this says)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  except (AttributeError, ValueError):  # option absent from this JAX version
    pass
  jax.distributed.initialize(**kwargs)
  logging.info("process %d of %d, %d local / %d global devices", jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())
  return True


def is_writer() -> bool:
  """True on the process that writes run files (process 0; the only one of a single-process run)."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Wait until every process got here (no-op with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)
