"""One chat reply: a user message (and optional system prompt) formatted with the chat template, sampled."""
from __future__ import annotations

import jax.numpy as jnp

from fineflax.sampling.chat import chat_prompt_ids
from fineflax.sampling.generate import generate


def answer(params, model_config, tokenizer, prompt: str, *, lora=None, lora_scale=1.0,
           max_new_tokens=64, dtype=jnp.float32, system_prompt: str = "", temperature: float = 0.0,
           top_k: int = 0, top_p: float = 1.0, rng=None) -> str:
  """The chat model's reply to one user message (greedy unless `temperature` > 0)."""
  messages = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
  messages.append({"role": "user", "content": prompt})
  ids = chat_prompt_ids(tokenizer, messages)
  out = generate(params, model_config, [ids], max_new_tokens=max_new_tokens, temperature=temperature,
                 top_k=top_k, top_p=top_p, rng=rng, tokenizer=tokenizer, lora=lora, lora_scale=lora_scale,
                 dtype=dtype)
  return out.texts[0]
