"""What the server decodes is the training forward's: for every model family the repo imports (tiny random
transformers models, f32), the served greedy tokens are the argmax of `decoder.forward` over the prompt and
the answer, and the served log-probs equal its log-softmax there (<= 1e-5), for a row of the base and a row
of a LoRA adapter decoding in the same batch, past the sliding windows (before this test's fix, the server
had its own transformer: a Gemma 2 answer differed from the first token on)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _sampling_fixtures import CharTokenizer
from fineflax.testing.hf_models import make_hf_model
from test_engine_parity import FAMILIES  # windows of 6-8 tokens: 5 prompt + 12 answer tokens run past them
from fineflax import lora as L
from fineflax.models import forward, load
from fineflax.serve.engine import Engine, Job

PROMPT, NEW = [5, 6, 7, 8, 9], 12


def _served(params, config, adapters):
  """{adapter: (tokens, raw log-probs)} of one greedy job per variant, decoded in one batch."""
  import time
  engine = Engine(params, config, CharTokenizer(config.vocab_size), adapters=adapters, slots=2, context=32,
                  chunk=4, dtype=jnp.float32, eos_ids=[]).start()
  events = {ad: [] for ad in (None, *adapters)}
  try:
    for ad, ev in events.items():
      engine.submit(Job(prompt=PROMPT, emit=ev.append, max_tokens=NEW, temperature=0.0, adapter=ad))
    deadline = time.time() + 300
    while time.time() < deadline and not all(ev and ev[-1][0] != "delta" for ev in events.values()):
      time.sleep(0.01)
  finally:
    engine.stop()
  assert engine.stats["mixed_adapter_calls"] > 0
  out = {}
  for ad, ev in events.items():
    assert ev[-1] == ("done", 0, "length", NEW), ev[-1]
    entries = [e for x in ev if x[0] == "delta" for e in x[3]]
    out[ad] = ([t for t, _ in entries], [lp for _, lp in entries])
  return out


@pytest.mark.parametrize("family", [f if f == "gemma2" else pytest.param(f, marks=pytest.mark.slow)
                                    for f in sorted(FAMILIES)])
def test_served_tokens_and_logprobs_equal_the_training_forward(family, tmp_path):
  name, overrides = FAMILIES[family]
  make_hf_model(name, tmp_path, initializer_range=0.2, **overrides)
  params, config, _ = load(tmp_path, dtype=jnp.float32, with_tokenizer=False)
  cfg = L.LoraConfig(r=4, alpha=8.0)
  lora = L.init_lora(params, config, cfg, jax.random.PRNGKey(0))
  lora = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(1), x.shape), lora)
  served = _served(params, config, {"tuned": (lora, cfg)})
  for ad, (tokens, logprobs) in served.items():
    kw = {} if ad is None else dict(lora=lora, lora_scale=L.lora_scale(cfg))
    logits = forward(params, config, jnp.asarray([PROMPT + tokens]), **kw)[0, len(PROMPT) - 1:-1]
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    assert tokens == np.argmax(logp, axis=-1).tolist(), (family, ad)
    np.testing.assert_allclose(logprobs, logp[np.arange(NEW), tokens], atol=1e-5, rtol=0, err_msg=f"{family} {ad}")
  assert np.abs(np.subtract(served[None][1], served["tuned"][1])).max() > 1e-3  # the adapter changes the model
