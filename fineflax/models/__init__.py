"""Decoder models: config, pure forward, weight import (HF folders, GGUF) and quantising the base."""
from fineflax.models.config import ModelConfig
from fineflax.models.decoder import (LINEAR_NAMES, default_positions, forward, forward_cached,
                                     forward_hidden, init_cache, init_params, logits_from_hidden,
                                     materialize, output_kernel)
from fineflax.models.hf_import import params_from_state_dict, state_dict_from_params
from fineflax.models.load import load, load_numpy, load_tokenizer, resolve_source
from fineflax.models.estimate import load_config, memory_estimate
from fineflax.models.quantize import quantize_params
