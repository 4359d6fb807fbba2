"""LoRA: config and scale, adapter init / checks / merge, LoRA-only gradients, PEFT import and export."""
from fineflax.lora.adapters import (check_lora, init_lora, linear_shapes, lora_delta,
                                    lora_value_and_grad, merge_lora)
from fineflax.lora.config import LoraConfig, lora_scale
from fineflax.models.targets import resolve_targets
from fineflax.lora.peft_io import adapter_config, export_hf, export_merged, export_peft, import_peft
