"""Sampling with LoRA adapters: greedy tokens equal the argmax of the adapted model's full forward."""
import jax
import jax.numpy as jnp
import numpy as np

from _sampling_fixtures import tiny_llama
from fineflax import lora as L
from fineflax import quant
from fineflax.models import forward
from fineflax.sampling import generate


def _greedy_by_forward(params, config, prompt, n, lora, scale):
  seq = list(prompt)
  for _ in range(n):
    logits = forward(params, config, jnp.asarray([seq]), lora=lora, lora_scale=scale)
    seq.append(int(jnp.argmax(logits[0, -1])))
  return seq[len(prompt):]


def test_greedy_with_lora_on_an_nf4_base_matches_full_forward():
  _, params, config = tiny_llama()
  base = quant.quantize_params(params, kind="nf4")
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
  for i, p in enumerate(prompts):
    assert out.tokens[i].tolist() == _greedy_by_forward(base, config, p, 6, lora, scale)
