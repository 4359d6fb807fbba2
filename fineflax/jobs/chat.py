"""Chat job: answer `config.prompt` with the model (optionally with a PEFT adapter and memory context)."""
from __future__ import annotations

import jax

from fineflax import lora as lora_lib
from fineflax.jobs.common import compute_dtype
from fineflax.models import load
from fineflax.sampling import format_chat, generate


def system_prompt_for(config) -> str:
  """config.system_prompt, plus RAG/SOP context from a memory store when config.memory_store is set."""
  if not config.memory_store:
    return config.system_prompt
  from memory.prompt import build_system_prompt
  return build_system_prompt(config.prompt, store=config.memory_store, base_prompt=config.system_prompt)


def run(config, workdir: str | None) -> str:
  dtype = compute_dtype(config)
  params, model_config, tokenizer = load(config.model.source, dtype=dtype)
  lora, scale = None, 1.0
  if config.model.adapter:
    lora, lora_cfg = lora_lib.import_peft(config.model.adapter, model_config)
    scale = lora_lib.lora_scale(lora_cfg)
  system = system_prompt_for(config)
  messages = ([{"role": "system", "content": system}] if system else [])
  messages.append({"role": "user", "content": config.prompt})
  ids = tokenizer(format_chat(tokenizer, messages), add_special_tokens=False)["input_ids"]
  s = config.sampling
  out = generate(params, model_config, [ids], max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                 top_k=s.top_k, top_p=s.top_p, tokenizer=tokenizer, rng=jax.random.PRNGKey(config.seed),
                 lora=lora, lora_scale=scale, dtype=dtype)
  text = out.texts[0]
  print(text, flush=True)
  return text
