"""benchmarks/profile_step.py: HLO parsing and kernel categories on a hand-written scheduled HLO text."""
from benchmarks.profile_step import categorize, parse_hlo, reads_u8, scope_of
import pytest

pytestmark = pytest.mark.fast

HLO = """HloModule jit_sft_step, is_scheduled=true

%fused_computation.1 (param_0.1: u8[2,4096]) -> bf16[128,64] {
  %param_0.1 = u8[2,4096]{1,0} parameter(0)
  ROOT %convert.1 = bf16[128,64]{1,0} convert(%param_0.1)
}

ENTRY %main (p0: u8[2,4096], p1: bf16[4,64], p2: f32[16]) -> (f32[16], bf16[4,64]) {
  %p0 = u8[2,4096]{1,0} parameter(0)
  %p1 = bf16[4,64]{1,0} parameter(1)
  %p2 = f32[16]{0} parameter(2)
  %fusion.7 = bf16[128,64]{1,0} fusion(%p0), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(sft_step)/while/body/closed_call"}
  %custom-call.3 = (bf16[4,64]{1,0}, s8[0]{0}) custom-call(%p1, %fusion.7), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(sft_step)/dot_general"}
  %custom-call.4 = (bf16[4,64]{1,0}, u8[0]{0}) custom-call(%p1, %p1, %p1), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(sft_step)/attn"}
  %loop_dynamic_update_slice_fusion.2 = bf16[4,64]{1,0} fusion(%p1), kind=kLoop, calls=%fused_computation.1
  %add.9 = f32[16]{0} add(%p2, %p2), metadata={op_name="jit(sft_step)/optimizer/add"}
  %mul.1 = bf16[4,64]{1,0} multiply(%p1, %p1), metadata={op_name="jit(sft_step)/loss_head/mul"}
  ROOT %tuple.1 = (f32[16]{0}, bf16[4,64]{1,0}) tuple(%add.9, %mul.1)
}
"""


def test_parse_and_categorize():
  hlo = parse_hlo(HLO)
  assert hlo["custom-call.3"]["opcode"] == "custom-call" and hlo["tuple.1"]["opcode"] == "tuple"
  assert hlo["custom-call.3"]["shape"] == "(bf16[4,64]{1,0}, s8[0]{0})"
  assert reads_u8("fusion.7", hlo) and not reads_u8("custom-call.3", hlo) and not reads_u8("p0", hlo)
  cat = lambda op, kernel="k": categorize(op, kernel, hlo)
  assert cat("custom-call.3") == "matmul"
  assert cat("custom-call.4") == "attention"
  assert cat("fusion.7") == "dequant"
  assert cat("loop_dynamic_update_slice_fusion.2") == "copies"
  assert cat("add.9") == "optimizer"
  assert cat("mul.1") == "elementwise"
  assert cat("unknown", "sm90_xmma_gemm_bf16bf16") == "matmul"
  assert cat("unknown", "Memcpy DtoD") == "copies"
  assert scope_of("mul.1", hlo) == "loss_head" and scope_of("add.9", hlo) == "optimizer"
  assert scope_of("fusion.7", hlo) == "layers / other"
