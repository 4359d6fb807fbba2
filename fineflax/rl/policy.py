"""The policy an environment rolls out: frozen base + the current LoRA, with the run's sampling settings."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from fineflax.sampling import generate


@dataclasses.dataclass(frozen=True)
class Policy:
  """base params, model config, tokenizer, LoRA pytree (None = the base alone) and sampling settings.

  Rollouts sample softmax(logits / temperature) with nucleus `top_p`; the RL loss differentiates the
  same tempered distribution. `greedy` evaluation ignores both.
  """
  base: Any
  model_config: Any
  tokenizer: Any
  lora: Any
  lora_scale: float
  dtype: Any = jnp.float32
  temperature: float = 1.0
  top_p: float = 1.0
  max_new_tokens: int = 128
  mesh: Any = None  # rows and KV cache split over this mesh's devices (fineflax.mesh)
  dense_base: bool = False  # sample from a dense copy of a quantised base (SamplerSession(dense_base=...))
  decode_impl: str = "auto"  # the decoder: scan, unrolled or auto (`fineflax.engine.decode.decode_impl`)

  @property
  def eos_id(self) -> int:
    return self.model_config.eos_token_ids[0]

  @property
  def pad_id(self) -> int:
    return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id

  def sample(self, prompts, rng=None, greedy: bool = False):
    """`fineflax.sampling.SampleOutput` of one completion per prompt (token lists)."""
    return generate(self.base, self.model_config, prompts, max_new_tokens=self.max_new_tokens,
                    temperature=0.0 if greedy else self.temperature, top_p=self.top_p,
                    tokenizer=self.tokenizer, rng=rng, lora=self.lora, lora_scale=self.lora_scale,
                    dtype=self.dtype, mesh=self.mesh, dense_base=self.dense_base, impl=self.decode_impl)
