"""Sampling with LoRA adapters: greedy tokens equal the argmax of the adapted model's full forward."""
import jax
import jax.numpy as jnp
import numpy as np

from _sampling_fixtures import tiny_llama
from fineflax import lora as L
from fineflax.models import forward, quantize_params
from fineflax.sampling import generate


def _greedy_by_forward(params, config, prompts, n, lora, scale, width=16):
  """Greedy by full forwards (no KV cache), one prompt at a time. Each sequence is right-padded to
  `width`, so one compiled program serves every step and prompt: causal attention, the logits at t do not
  read the padding."""
  fwd = jax.jit(lambda p, lo, t: forward(p, config, t, lora=lo, lora_scale=scale))
  outs = []
  for prompt in prompts:
    seq = list(prompt)
    for _ in range(n):
      logits = fwd(params, lora, jnp.asarray([seq + [0] * (width - len(seq))]))
      seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
    outs.append(seq[len(prompt):])
  return outs


def test_greedy_with_lora_on_an_nf4_base_matches_full_forward():
  _, params, config = tiny_llama()
  base = quantize_params(params, kind="nf4")
  cfg = L.LoraConfig(r=4, alpha=8.0)
  lora = L.init_lora(base, config, cfg, jax.random.PRNGKey(0))
  lora = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(1), x.shape), lora)
  scale = L.lora_scale(cfg)
  prompts = [[5, 9, 14, 3], [7, 7, 21]]
  out = generate(base, config, prompts, max_new_tokens=6, temperature=0.0, eos_ids=(), lora=lora,
                 lora_scale=scale, dtype=jnp.float32)
  plain = generate(base, config, prompts, max_new_tokens=6, temperature=0.0, eos_ids=(),
                   dtype=jnp.float32)
  assert not np.array_equal(out.tokens, plain.tokens)  # the adapters change the answer
  assert out.tokens.tolist() == _greedy_by_forward(base, config, prompts, 6, lora, scale)
