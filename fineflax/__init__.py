"""fineflax: post-training of language models in JAX/Flax (QLoRA SFT, GRPO-family RL, LUFFY, ExGRPO,
Search-R1) beside a retrieval and memory layer."""
import os

# transformers serves tokenizers here; its "PyTorch was not found" advisory is not for a JAX user
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
