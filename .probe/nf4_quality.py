"""SmolLM2-135M (Q4_1 GGUF, dequantised f32) vs NF4 / int8 re-quantisation: next-token KL and top-1 agreement."""
import jax, jax.numpy as jnp, numpy as np
from fineflax.models import load, forward, quantize_params
from fineflax.quant.params import dequantize_params
params, config, tok = load("smollm2-135m-instruct")
texts = ["The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
         "What is 12 + 7? The answer is 19. What is 23 + 14? The answer is 37. What is 8 + 16? The answer is",
         "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
         "Once upon a time, there was a little girl who lived in a village near the forest. Every day she"]
ids = [tok(t)["input_ids"] for t in texts]
L = min(len(i) for i in ids); toks = jnp.asarray([i[:L] for i in ids])
ref = jax.nn.log_softmax(forward(params, config, toks), -1)
for kind in ("nf4", "int8"):
  q = dequantize_params(quantize_params(params, kind=kind), jnp.float32)
  lp = jax.nn.log_softmax(forward(q, config, toks), -1)
  kl = float(jnp.mean(jnp.sum(jnp.exp(ref) * (ref - lp), -1)))
  top1 = float(jnp.mean(jnp.argmax(ref, -1) == jnp.argmax(lp, -1)))
  print(kind, "KL", round(kl, 4), "top1 agree", round(top1, 3))
