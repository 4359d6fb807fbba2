"""The train state of every job: a plain dict pytree {"step", "lora", "opt_state", "rng"}."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

State = dict[str, Any]  # {"step": int32, "lora": pytree, "opt_state": pytree, "rng": key}


def init_state(lora, optimizer, seed: int) -> State:
  """step 0, the trainable LoRA pytree, the optimizer's state for it, and a PRNG key from `seed`."""
  return {"step": jnp.zeros((), jnp.int32), "lora": lora, "opt_state": optimizer.init(lora),
          "rng": jax.random.PRNGKey(seed)}
