"""Model FLOPs of a LoRA training step and model FLOPs utilisation (MFU).

For one step on B sequences of T tokens (N = B*T tokens) of a decoder with L layers, hidden H, vocabulary V,
Hq query heads of size D, frozen base linears of P_lin = sum over layers of in*out parameters, and rank-r
adapters on the targeted linears (sum over layers and targets of r*(in + out) = P_lora):

  base   = 2 * N * (P_lin + H*V)  forward  +  2 * N * (P_lin + H*V)  input gradient   = 4 N (P_lin + H V)
           (the frozen weights get no weight gradient; H*V is the output projection, tied or not)
  lora   = 2 N P_lora forward + 2 N P_lora input gradient + 2 N P_lora weight gradient = 6 N P_lora
  attn   = forward q.k and p.v over the causal T^2/2 pairs of each sequence, 2 matmuls * 2 flops:
           2 * B * T^2 * Hq * D per layer; backward (dq, dk, dv, dp) = 2x forward
           -> 6 * B * T^2 * Hq * D * L
  flops  = base + lora + attn        (recomputation under remat is not counted: these are model FLOPs)
  MFU    = flops / step_seconds / peak,  peak = the chip's dense bf16 tensor-core FLOP/s (`PEAK_BF16_FLOPS`).

Llama-3.2-1B shape, B x T = 4 x 1024, r = 16 on all seven linears: 21.35 TFLOP a step, so 58.6k tokens/s
(69.9 ms a step) is 30.9% MFU on an H100 SXM / H200 (989 TFLOP/s) and 45% needs <= 48.0 ms (>= 85.4k tokens/s).
"""
from __future__ import annotations

from typing import Sequence

from fineflax.models.config import ModelConfig

ALL_LINEARS = ("q", "k", "v", "o", "gate", "up", "down")
# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, FLOP/s, keyed by a substring of the
# device name (`jax.devices()[0].device_kind`, `nvidia-smi` name). First match wins: PCIe/NVL before SXM.
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),   # H100 SXM5 (device kind "NVIDIA H100 80GB HBM3")
    ("H200", 989e12),   # H200 SXM: same tensor cores as H100 SXM
    ("H20", 148e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("B200", 2250e12),
)


def peak_bf16_flops(device_name: str) -> float | None:
  """The dense bf16 peak FLOP/s of the named device, or None when it is not in `PEAK_BF16_FLOPS` (CPUs)."""
  for key, peak in PEAK_BF16_FLOPS:
    if key.lower() in device_name.lower():
      return peak
  return None


def lora_step_flops(config: ModelConfig, batch: int, seq: int, lora_rank: int = 16,
                    targets: Sequence[str] = ALL_LINEARS) -> dict[str, float]:
  """Model FLOPs of one LoRA step on `batch` x `seq` tokens (formula in the module docstring).

  Returns {"base", "lora", "attention", "total"}. Base linears not in `targets` still count in `base`.
  """
  if batch <= 0 or seq <= 0 or lora_rank < 0:
    raise ValueError(f"batch={batch}, seq={seq}, lora_rank={lora_rank}: need batch, seq > 0 and rank >= 0")
  unknown = sorted(set(targets) - set(ALL_LINEARS))
  if unknown:
    raise ValueError(f"LoRA targets {unknown} are not linears of the decoder; choose from {ALL_LINEARS}")
  c, n = config, batch * seq
  shapes = c.linear_shapes()
  p_lin = c.num_layers * sum(i * o for i, o in shapes.values())
  p_head = c.hidden_size * c.vocab_size
  p_lora = c.num_layers * sum(lora_rank * (i + o) for name, (i, o) in shapes.items() if name in targets)
  base = 4.0 * n * (p_lin + p_head)
  lora = 6.0 * n * p_lora
  attention = 6.0 * batch * seq * seq * c.num_heads * c.head_dim * c.num_layers
  return {"base": base, "lora": lora, "attention": attention, "total": base + lora + attention}


def mfu(flops_per_step: float, step_seconds: float, peak_flops: float | None) -> float | None:
  """flops_per_step / step_seconds / peak_flops (a fraction); None when the peak is unknown."""
  if peak_flops is None:
    return None
  if step_seconds <= 0:
    raise ValueError(f"step_seconds={step_seconds}: must be > 0")
  return flops_per_step / step_seconds / peak_flops
