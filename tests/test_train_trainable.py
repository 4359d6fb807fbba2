"""What a job trains (fineflax/train/trainable.py): the config checks, the (trainable, base) -> weights rule,
float32 optimizer state for bf16 params, the full/LoRA split of the loaded model, resuming old configs."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fineflax.config_checks import ConfigError
from fineflax.jobs.resolve import load_config
from fineflax.testing.batches import random_sft_batch
from fineflax.train import trainable as T
from fineflax.train.optim import with_f32_state
from fineflax.train.run_config import config_diff



def _sft(*over):
  return load_config("configs/quickstart.py", list(over))


@pytest.mark.fast
def test_full_training_of_a_quantised_base_is_refused_naming_the_knob():
  with pytest.raises(ConfigError, match=r"^config.model.quant='nf4': config.train.params='full' .*"
                                        r"set config.model.quant=none"):
    T.validate(_sft("train.params=full"))  # quickstart's base is nf4
  T.validate(_sft("train.params=full", "model.quant=none"))
  T.validate(_sft())  # LoRA on nf4 (QLoRA) stays fine
  with pytest.raises(ConfigError, match=r"^config.train.params='half': choose one of 'lora', 'full'"):
    T.validate(_sft("train.params=half"))
  with pytest.raises(ConfigError, match=r"^config.train.master_dtype='float16'"):
    T.validate(_sft("train.params=full", "model.quant=none", "train.master_dtype=float16"))
  with pytest.raises(ConfigError, match=r"^config.lora.init_from='runs/x/adapter': .*config.train.params='full'"):
    T.validate(_sft("train.params=full", "model.quant=none", "lora.init_from=runs/x/adapter"))


@pytest.mark.fast
def test_model_weights_full_when_there_is_no_base():
  base, lora, full = {"w": 1}, {"a": 2}, {"w": 3}
  assert T.model_weights(lora, base) == (base, lora)
  assert T.model_weights(None, base) == (base, None)  # the LoRA-mode KL reference: adapters off
  assert T.model_weights(full, None) == (full, None)
  with pytest.raises(ValueError, match="no weights"):
    T.model_weights(None, None)


@pytest.mark.fast
def test_bf16_params_get_float32_moments_and_the_float32_update_rounded():
  p32 = {"w": jax.random.normal(jax.random.PRNGKey(0), (4, 8)), "n": jnp.ones((8,))}
  g32 = jax.tree.map(lambda x: 1e-3 * jax.random.normal(jax.random.PRNGKey(1), x.shape), p32)
  p16, g16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), (p32, g32))
  inner = optax.adamw(1e-2, weight_decay=0.1)
  tx = with_f32_state(inner)
  state = tx.init(p16)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state[0].mu) + jax.tree.leaves(state[0].nu))
  updates, state = jax.jit(tx.update)(g16, state, p16)
  new = optax.apply_updates(p16, updates)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(new))
  # reference: AdamW in float32 on the float32 values of the bf16 params and grads, rounded to bf16 at the end
  f32 = lambda t: jax.tree.map(lambda x: x.astype(jnp.float32), t)
  ref_u, _ = jax.jit(inner.update)(f32(g16), inner.init(f32(p16)), f32(p16))
  want = jax.tree.map(lambda p, u: (p + u).astype(jnp.bfloat16), f32(p16), ref_u)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32)),
               new, want)
  # float32 params: the wrapper changes nothing
  u_plain, _ = jax.jit(inner.update)(g32, inner.init(p32), p32)
  u_wrapped, _ = jax.jit(tx.update)(g32, tx.init(p32), p32)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), u_plain, u_wrapped)


@pytest.mark.fast
def test_split_model_full_and_lora():
  base = {"w": jnp.ones((4, 4), jnp.bfloat16), "ids": jnp.arange(3)}
  lora = {"a": jnp.zeros((4, 2))}
  t = T.split_model(_sft(), base, lora)
  assert (t.params, t.base, t.reference, t.full) == (lora, base, None, False)
  t = T.split_model(_sft("train.params=full", "model.quant=none"), base, lora, keep_reference=True)
  assert t.full and t.base is None and t.params["w"] is base["w"]
  # the reference is never the trainable arrays (the donating steps delete those): a copy of equal values
  assert not any(a is b for a, b in zip(jax.tree.leaves(t.reference), jax.tree.leaves(t.params)))
  assert all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(t.reference), jax.tree.leaves(base)))
  assert t.donate and not T.split_model(_sft(), base, lora).donate  # full mode donates, LoRA mode keeps
  assert T.split_model(_sft("train.params=full", "model.quant=none"), base, lora).reference is None
  t = T.split_model(_sft("train.params=full", "model.quant=none", "train.master_dtype=float32"), base, lora,
                    keep_reference=True)
  assert t.params["w"].dtype == jnp.float32 and t.params["ids"].dtype == base["ids"].dtype
  assert t.reference is base  # the frozen copy stays in the compute dtype
  assert t.weights(t.params) == (t.params, None)


@pytest.mark.fast
def test_a_run_saved_before_the_train_section_resumes_as_lora():
  current = _sft().to_dict()
  saved = {k: v for k, v in current.items() if k != "train"}
  assert config_diff(saved, current) == []
  full = _sft("train.params=full").to_dict()
  assert config_diff(saved, full) == [("train.params", "lora", "full")]


def test_the_full_path_reads_the_same_model_as_a_zero_lora_on_it():
  """sft_nll of the full params (base None) == sft_nll of a LoRA with B = 0 on them as the frozen base; and
  its gradient reaches every weight (the LoRA path's reaches none of the base)."""
  from fineflax import lora as L
  from fineflax.models import ModelConfig, init_params
  from fineflax.train.sft_step import sft_nll
  c = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=16)
  params = init_params(c, jax.random.PRNGKey(0))
  lora = L.init_lora(params, c, L.LoraConfig(r=2, alpha=4.0), jax.random.PRNGKey(1))  # B = 0
  batch = random_sft_batch(np.random.RandomState(0), (2, 8), 64)
  nll = jax.jit(lambda trainable, base: sft_nll(trainable, base, batch, model_config=c, lora_scale=2.0))
  (full, n), grads = jax.value_and_grad(nll, has_aux=True)(params, None)
  adapted, n2 = nll(lora, params)
  np.testing.assert_allclose(float(full), float(adapted), rtol=1e-6)
  assert float(n) == float(n2) == batch["loss_mask"].sum()
  assert jax.tree.structure(grads) == jax.tree.structure(params)
  assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))
