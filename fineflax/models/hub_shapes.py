"""Architectures of the papers' hub models, so a plan (`launch.py --dry_run`, the fit check at start) can be
made from the hub name alone, without downloading anything.

`HUB_CONFIGS[name]` holds the fields of that model's `config.json` that fix its shape and memory (layers,
widths, heads, vocabulary, tied embeddings, biases by model type) and the rope / position fields of the
public file. A run that loads weights reads the checkpoint's own `config.json` (`fineflax.models.load`);
these entries only stand in for it where no weights are read (`fineflax.models.estimate.load_config`).
Sources: the models' Hugging Face `config.json` files; "Elliott/Qwen2.5-Math-7B-16k-think" (LUFFY's and
ExGRPO's backbone) is Qwen2.5-Math-7B with its context raised to 16k positions (LUFFY README), entered
with Qwen2.5-Math-7B's fields and max_position_embeddings 16384 (its rope_theta is not a planning input).
"""
from __future__ import annotations

_QWEN2 = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-6,
              bos_token_id=151643, eos_token_id=151643, use_sliding_window=False)
_QWEN25_7B = dict(_QWEN2, vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                  num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
_QWEN25_3B = dict(_QWEN2, vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                  num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True)
_QWEN25_1_5B = dict(_QWEN2, vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                    num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True)
_LLAMA3 = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu", rms_norm_eps=1e-5,
               vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072, bos_token_id=128000,
               eos_token_id=128001, attention_bias=False, mlp_bias=False)
_LLAMA3_ROPE = dict(factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
                    original_max_position_embeddings=8192, rope_type="llama3")

HUB_CONFIGS: dict[str, dict] = {
    "Qwen/Qwen2.5-Math-7B": dict(_QWEN25_7B, rope_theta=10000.0, max_position_embeddings=4096),
    "Elliott/Qwen2.5-Math-7B-16k-think": dict(_QWEN25_7B, rope_theta=10000.0, max_position_embeddings=16384),
    "Qwen/Qwen2.5-7B": dict(_QWEN25_7B, rope_theta=1000000.0, max_position_embeddings=131072),
    "Qwen/Qwen2.5-7B-Instruct": dict(_QWEN25_7B, rope_theta=1000000.0, max_position_embeddings=32768,
                                     eos_token_id=151645),
    "Qwen/Qwen2.5-3B": dict(_QWEN25_3B, rope_theta=1000000.0, max_position_embeddings=32768),
    "Qwen/Qwen2.5-3B-Instruct": dict(_QWEN25_3B, rope_theta=1000000.0, max_position_embeddings=32768,
                                     eos_token_id=151645),
    "Qwen/Qwen2.5-Math-1.5B": dict(_QWEN25_1_5B, rope_theta=10000.0, max_position_embeddings=4096),
    "Qwen/Qwen2.5-1.5B": dict(_QWEN25_1_5B, rope_theta=1000000.0, max_position_embeddings=131072),
    "meta-llama/Llama-3.2-3B": dict(_LLAMA3, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                                    num_attention_heads=24, num_key_value_heads=8, head_dim=128,
                                    tie_word_embeddings=True, rope_scaling=_LLAMA3_ROPE),
    "meta-llama/Llama-3.1-8B": dict(_LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                    num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                    tie_word_embeddings=False, rope_scaling=dict(_LLAMA3_ROPE, factor=8.0)),
    "meta-llama/Llama-3.1-70B": dict(_LLAMA3, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                     num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                                     tie_word_embeddings=False, rope_scaling=dict(_LLAMA3_ROPE, factor=8.0)),
}


def hub_config(name: str) -> dict | None:
  """The `config.json` fields of hub model `name` (a copy), or None when it is not one of HUB_CONFIGS."""
  entry = HUB_CONFIGS.get(str(name))
  return None if entry is None else dict(entry)
