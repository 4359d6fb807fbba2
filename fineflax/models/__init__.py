"""Decoder models: config, pure forward, and weight import (HF folders, GGUF)."""
from fineflax.models.config import ModelConfig
from fineflax.models.decoder import (LINEAR_NAMES, default_positions, forward, forward_cached,
                                     forward_hidden, init_cache, init_params, logits_from_hidden,
                                     materialize, output_kernel)
