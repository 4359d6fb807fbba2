"""MFU's FLOP formula against a hand count on a tiny shape, and the peak lookup."""
import pytest

from fineflax.models import ModelConfig
from fineflax.models.flops import lora_step_flops, mfu, peak_bf16_flops

pytestmark = pytest.mark.fast


def tiny():
  # H=8, I=16, L=2, Hq=2, Hkv=1, D=4, V=10
  return ModelConfig(vocab_size=10, hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2,
                     num_kv_heads=1, head_dim=4)


def test_lora_step_flops_matches_hand_count():
  # per layer (in, out): q 8x8=64, k 8x4=32, v 32, o 8x8=64, gate 8x16=128, up 128, down 16x8=128 -> 576
  # P_lin = 2 * 576 = 1152; head H*V = 80. N = B*T = 2*3 = 6 tokens.
  # base = 4 * 6 * (1152 + 80) = 29568
  # LoRA r=2 on q and down only: q 2*(8+8)=32, down 2*(16+8)=48 -> 80 a layer, 160 in all; 6*6*160 = 5760
  # attention = 6 * B * T^2 * Hq * D * L = 6 * 2 * 9 * 2 * 4 * 2 = 1728
  f = lora_step_flops(tiny(), batch=2, seq=3, lora_rank=2, targets=("q", "down"))
  assert f == {"base": 29568.0, "lora": 5760.0, "attention": 1728.0, "total": 37056.0}


def test_lora_step_flops_llama_1b_shape():
  mc = ModelConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                   num_kv_heads=8, head_dim=64, tie_word_embeddings=True)
  f = lora_step_flops(mc, 4, 1024)
  assert f["total"] == pytest.approx(21.348e12, rel=1e-4)
  # the 58.6k tokens/s is ~31% of an H100 SXM / H200
  assert mfu(f["total"], 4096 / 58.6e3, peak_bf16_flops("NVIDIA H200")) == pytest.approx(0.3088, abs=1e-3)


def test_peak_lookup_and_errors():
  assert peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
  assert peak_bf16_flops("gpu: NVIDIA H100 PCIe") == 756e12
  assert peak_bf16_flops("cpu (x86_64)") is None
  assert mfu(1e12, 1.0, None) is None
  with pytest.raises(ValueError, match="not linears"):
    lora_step_flops(tiny(), 1, 1, targets=("qkv",))
  with pytest.raises(ValueError, match="step_seconds"):
    mfu(1.0, 0.0, 1.0)
