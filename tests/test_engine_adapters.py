"""Per-row LoRA adapters: a batch mixing two adapters (different ranks and targets) and the base, with
refilled rows and sampling, gives each request exactly what an engine with that one adapter gives it alone."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _sampling_fixtures import tiny_llama
from fineflax.engine import Engine, Request
from fineflax.engine.adapters import stack_adapters


def _adapters(config):
  rng = np.random.default_rng(4)
  shapes = config.linear_shapes()
  out = []
  for rank, targets, scale in [(2, ("q", "k", "v", "o", "gate", "up", "down"), 2.0), (5, ("q", "up"), 0.5)]:
    lora = {t: {"a": jnp.asarray(0.3 * rng.standard_normal((config.num_layers, shapes[t][0], rank)), jnp.float32),
                "b": jnp.asarray(0.3 * rng.standard_normal((config.num_layers, rank, shapes[t][1])), jnp.float32)}
            for t in targets}
    out.append((lora, scale))
  return out


def _requests():
  key = jax.random.key(11)
  return [Request([5, 6, 7, 8, 9], max_new_tokens=9, adapter=0),
          Request([5, 6, 7, 8, 9], max_new_tokens=9, adapter=1),
          Request(list(range(10, 27)), max_new_tokens=7, adapter=None),
          Request([30, 31, 32], max_new_tokens=8, temperature=1.0, key=jax.random.fold_in(key, 1), adapter=1),
          Request([40, 41], max_new_tokens=6, temperature=0.8, top_p=0.9, key=key, adapter=0)]


@pytest.mark.parametrize("impl", ["scan", pytest.param("unrolled", marks=pytest.mark.slow)])
def test_mixed_adapter_batch_equals_each_adapter_alone(impl):
  _, params, config = tiny_llama()
  adapters = _adapters(config)
  kw = dict(num_pages=64, page_size=4, dtype=jnp.float32, eos_ids=(), chunk_size=4, impl=impl)
  mixed = Engine(params, config, max_rows=3, adapters=adapters, **kw)
  seqs = [mixed.submit(r) for r in _requests()]
  mixed.run()
  assert mixed.stats["mixed_adapter_calls"] > 0 and mixed.stats["peak_rows"] == 3
  outputs = set()
  for req, seq in zip(_requests(), seqs):
    lora, scale = (None, 1.0) if req.adapter is None else adapters[req.adapter]
    alone = Engine(params, config, max_rows=1, lora=lora, lora_scale=scale, **kw)
    ref = alone.submit(Request(req.prompt, req.max_new_tokens, req.temperature, req.top_k, req.top_p, req.key))
    alone.run()
    assert seq.tokens == ref.tokens, (req, seq.tokens, ref.tokens)
    np.testing.assert_allclose(seq.raw_logprobs, ref.raw_logprobs, atol=1e-5)
    outputs.add((tuple(req.prompt), tuple(seq.tokens)))
  assert len(outputs) == 5  # the first two rows: one prompt, the adapters change the answer


def test_adapter_errors():
  _, params, config = tiny_llama()
  adapters = _adapters(config)
  with pytest.raises(ValueError, match="not both|one adapter for all rows"):
    Engine(params, config, max_rows=2, num_pages=16, lora=adapters[0][0], adapters=adapters)
  engine = Engine(params, config, max_rows=2, num_pages=16, page_size=4, adapters=adapters, dtype=jnp.float32)
  with pytest.raises(ValueError, match="adapter=2: the engine serves 2"):
    engine.submit(Request([1, 2], max_new_tokens=2, adapter=2))
  with pytest.raises(ValueError, match="adapters differ"):
    engine.submit_group([Request([1, 2], 2, adapter=0), Request([1, 2], 2, adapter=1)])
  bad = {"q": {"a": jnp.zeros((config.num_layers, 3, 2)), "b": jnp.zeros((config.num_layers, 2, 64))}}
  with pytest.raises(ValueError, match="adapter 0, linear 'q'"):
    stack_adapters([(bad, 1.0)], config)
