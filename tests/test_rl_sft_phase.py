"""The SFT phase of the RL job (fineflax/rl/sft_phase.py): its batch trains exactly the trace tokens, and
the SFT loss equals the RL path's log-probs of the same completions (an independent computation)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.models import ModelConfig, init_params
from fineflax.rl import rows as R
from fineflax.rl.batch import build_rl_batch
from fineflax.rl.sft_phase import demonstration_rows, sft_batch
from fineflax.rl.step import completion_logp
from fineflax.train.sft_step import sft_nll

pytestmark = pytest.mark.fast

CFG = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, eos_token_ids=(1,))


def _rows(seed=0, b=5):
  rng = np.random.RandomState(seed)
  rows = R.empty_rows()
  for _ in range(b):
    prompt = list(rng.randint(2, 97, rng.randint(3, 9)))
    comp = list(rng.randint(2, 97, rng.randint(2, 12)))
    R.extend(rows, R.fixed_row(prompt, comp, "t"))
  return rows


def test_sft_batch_trains_exactly_the_trace_tokens_and_pads_inertly():
  rows = _rows()
  batch = sft_batch(rows, pad_id=0, max_new_tokens=16, multiple=4)
  assert batch["tokens"].shape[:2] == (1, 8)  # 5 rows padded to a multiple of 4 devices
  assert batch["loss_mask"][0, 5:].sum() == 0  # padding copies train nothing
  for i, comp in enumerate(rows["completion"]):
    mask = batch["loss_mask"][0, i] > 0
    assert batch["targets"][0, i][mask].tolist() == comp  # each loss position predicts the next trace token
    tok = batch["tokens"][0, i]
    assert tok[np.flatnonzero(mask) + 1].tolist() == comp


def test_sft_loss_is_the_rl_paths_trace_nll_at_temperature_one():
  base = init_params(CFG, jax.random.PRNGKey(0))
  rows = _rows(1)
  keys = iter(jax.random.split(jax.random.PRNGKey(3), 4))
  lora = {n: {"a": 0.1 * jax.random.normal(next(keys), (2, 32, 4)),
              "b": 0.1 * jax.random.normal(next(keys), (2, 4, 32))} for n in ("q",)}
  batch = {k: jnp.asarray(v[0]) for k, v in sft_batch(rows, pad_id=0, max_new_tokens=16).items()}
  nll, n = sft_nll(lora, base, batch, model_config=CFG, lora_scale=2.0)
  rl = build_rl_batch(rows["prompt"], rows["completion"], rows["loss_mask"], pad_id=0, completion_width=32)
  logp, _ = completion_logp(lora, base, {k: jnp.asarray(v) for k, v in rl.items()}, model_config=CFG,
                            lora_scale=2.0, temperature=1.0)
  assert float(n) == sum(len(c) for c in rows["completion"])
  np.testing.assert_allclose(float(nll), -float((logp * rl["mask"]).sum()), rtol=1e-5)


def test_demonstration_rows_needs_a_trace():
  class NoTraces:
    def demonstrations(self, env, policy, items):
      return [None] * len(items)
  with pytest.raises(ValueError, match="no demonstration"):
    demonstration_rows(NoTraces(), None, None, [1, 2])


def test_negative_sft_steps_is_a_config_error():
  from fineflax.config_checks import ConfigError
  from fineflax.jobs.resolve import load_config
  from fineflax.jobs.rl import validate
  with pytest.raises(ConfigError, match=r"config.rl.sft_steps=-1: an integer >= 0"):
    validate(load_config("configs/luffy_arith.py:smoke", ["rl.sft_steps=-1"]))
