"""Weight quantisation of the frozen base: NF4 (QLoRA, bitsandbytes-compatible) and per-column int8."""
from fineflax.quant.blockwise import dynamic_code
from fineflax.quant.int8 import Int8Tensor, quantize_int8
from fineflax.quant.nf4 import NF4_CODE, NF4Tensor, quantize_nf4
from fineflax.quant.params import (QUANT_KINDS, bits_per_parameter, dequantize_params, full_shape,
                                   is_quantized, quantize_layers, quantize_tensor)
