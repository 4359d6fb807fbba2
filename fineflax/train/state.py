"""The train state of every job: a plain dict pytree {"step", "params", "opt_state", "rng"}.

"params" is the trainable pytree: the LoRA adapter (config.train.params="lora") or every parameter of
the model ("full"). Checkpoints written before the rename hold it under "lora" (`LEGACY_KEYS`); the
checkpointer restores them under the new name.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

State = dict[str, Any]  # {"step": int32, "params": pytree, "opt_state": pytree, "rng": key}
LEGACY_KEYS = {"lora": "params"}  # old state key -> its name now


def init_state(params, optimizer, seed: int) -> State:
  """step 0, the trainable pytree, the optimizer's state for it, and a PRNG key from `seed`."""
  return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": optimizer.init(params),
          "rng": jax.random.PRNGKey(seed)}
