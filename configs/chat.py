"""Generate an answer to one prompt: python launch.py --config configs/chat.py --config.prompt="..."."""
import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.job = "chat"  # fineflax.jobs.chat
  config.seed = 0  # PRNG seed for sampling

  config.model = ml_collections.ConfigDict()
  config.model.source = "smollm2-135m-instruct"  # HF folder, .gguf file, hub name or alias
  config.model.dtype = "auto"  # compute and weight dtype: auto (float32 on CPU, bfloat16 on GPU), float32 or bfloat16
  config.model.adapter = ""  # optional PEFT adapter folder to apply (from an SFT/RL run's export)

  config.prompt = "Explain in two sentences why the sky is blue."  # the user message
  config.system_prompt = ""  # system message; empty keeps the chat template's default
  config.memory_store = ""  # memory/ vector store folder (python -m memory.ingest): adds RAG context
  config.memory_collection = "default"  # collection of that store to search
  config.sop_folder = ""  # folder of SOP JSON files (e.g. memory/sops): adds the matching procedure
  config.verbose = False  # print the system prompt used (memory context and SOP) before the answer

  config.sampling = ml_collections.ConfigDict()
  config.sampling.max_new_tokens = 96  # generation budget
  config.sampling.temperature = 0.0  # 0 = greedy
  config.sampling.top_k = 0  # 0 = off
  config.sampling.top_p = 1.0  # nucleus mass; 1.0 = off
  return config
