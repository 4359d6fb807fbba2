import jax, jax.numpy as jnp, re
from jax import export
from fineflax.quant import nf4_kmajor_gemv as km
from fineflax.quant.nf4_kmajor import from_nf4
from fineflax.quant.nf4 import quantize_nf4
w = from_nf4(quantize_nf4(jax.random.normal(jax.random.PRNGKey(0), (512, 128)), 64))
x = jnp.ones((16, 512), jnp.bfloat16)
for st in (1, 3):
  cfg = km.KMajorConfig(path="dot", bkb=64, iters=2, num_stages=st)
  f = jax.jit(lambda x, w, cfg=cfg: km.kmajor_matmul(x, w, jnp.bfloat16, cfg))
  t = export.export(f, platforms=["cuda"], disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(x, w).mlir_module()
  print(st, re.findall(r'num_stages[^,]{0,30}', t)[:3], re.findall(r'backend_config[^>]{0,200}', t)[:1])
