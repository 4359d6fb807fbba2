"""benchmarks/nf4_dequant.py: its dequantisation variants equal NF4Tensor.dequantize bit for bit, and its
check for a GEMM fusion that reads the u8 codes."""
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.nf4_dequant import dequant_variants, fused_dot
from fineflax.quant import quantize_nf4

UNFUSED = """HloModule m

%fused_computation.1 (param_0.1: u8[64,32]) -> bf16[64,64] {
  %param_0.1 = u8[64,32]{1,0} parameter(0)
  ROOT %convert.1 = bf16[64,64]{1,0} convert(%param_0.1)
}

ENTRY %main (p0: u8[64,32], p1: bf16[8,64]) -> bf16[8,64] {
  %p0 = u8[64,32]{1,0} parameter(0)
  %p1 = bf16[8,64]{1,0} parameter(1)
  %fusion.1 = bf16[64,64]{1,0} fusion(%p0), kind=kLoop, calls=%fused_computation.1
  ROOT %dot.2 = bf16[8,64]{1,0} dot(%p1, %fusion.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
FUSED = UNFUSED.replace("""  ROOT %convert.1 = bf16[64,64]{1,0} convert(%param_0.1)
}""", """  %convert.1 = bf16[64,64]{1,0} convert(%param_0.1)
  %param_1.1 = bf16[8,64]{1,0} parameter(1)
  ROOT %dot.1 = bf16[8,64]{1,0} dot(%param_1.1, %convert.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}""")


def test_variants_are_bit_identical():
  w = 0.02 * jax.random.normal(jax.random.PRNGKey(0), (128, 192), jnp.float32)
  t = quantize_nf4(w.astype(jnp.bfloat16))
  ref = np.asarray(t.dequantize(jnp.bfloat16).astype(jnp.float32))
  for name, deq in dequant_variants().items():
    np.testing.assert_array_equal(np.asarray(jax.jit(deq)(t).astype(jnp.float32)), ref, err_msg=name)


def test_fused_dot_finds_only_a_fusion_holding_codes_and_dot():
  assert not fused_dot(UNFUSED)
  assert fused_dot(FUSED)
