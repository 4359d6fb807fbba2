"""Issue 46.1's options for full-parameter SFT, each equal in value to the default path on CPU: the fused
linear cross-entropy (config.train.loss_head="fused"), the named remat policies (model.remat attn, matmuls,
save:a,b: what they keep), and cuDNN's causal flash attention chosen for the full SFT step on a GPU."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.config_checks import ConfigError
from fineflax.jobs.resolve import load_config, validate_common
from fineflax.models import ModelConfig, decoder, init_params
from fineflax.models.remat import remat_saved_names
from fineflax.models.logprobs import chunked_token_logp, fused_weighted_nll
from fineflax.train.sft_step import sft_nll, sft_step
from fineflax.train.optim import make_optimizer
from fineflax.train.state import init_state
from fineflax.testing.batches import random_sft_batch

C = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=8, tie_word_embeddings=True)
OPT = type("Opt", (), dict(learning_rate=1e-2, warmup_steps=0, num_steps=10, end_lr_ratio=1.0, weight_decay=0.0,
                           b1=0.9, b2=0.999, grad_clip=1.0))


def _close(a, b, tol=2e-5):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol), a, b)


@pytest.mark.fast
@pytest.mark.parametrize("cap", [None, 4.0])
def test_fused_nll_equals_the_chunked_loss_and_its_gradients(cap):
  k = jax.random.split(jax.random.PRNGKey(0), 4)
  h, w = jax.random.normal(k[0], (2, 37, 16)), 0.3 * jax.random.normal(k[1], (16, 50))
  tokens, mask = jax.random.randint(k[2], (2, 37), 0, 50), (jax.random.uniform(k[3], (2, 37)) > 0.3).astype(float)
  ref = lambda h, w: -jnp.sum(mask * chunked_token_logp(h, w, tokens, 8, cap))
  fused = lambda h, w: fused_weighted_nll(h, w, tokens, mask, 8, cap)
  _close(fused(h, w), ref(h, w))
  _close(jax.jit(jax.grad(lambda h, w: 0.7 * fused(h, w), (0, 1)))(h, w), jax.grad(lambda h, w: 0.7 * ref(h, w), (0, 1))(h, w))
  _close(jax.grad(lambda h: fused(h, w))(h), jax.grad(lambda h: ref(h, w))(h))  # a frozen head: no dW made


@pytest.mark.fast
def test_a_full_sft_step_with_the_fused_head_equals_the_chunked_one():
  params = init_params(C, jax.random.PRNGKey(0), jnp.float32)
  batch = jax.tree.map(lambda x: x[None], random_sft_batch(np.random.RandomState(0), (2, 16), C.vocab_size))
  opt = make_optimizer(OPT)
  out = {}
  for head in ("chunked", "fused"):
    step = jax.jit(functools.partial(sft_step, optimizer=opt, model_config=C, lora_scale=0.0, dtype=jnp.float32,
                                     logits_chunk=8, causal_prefix=True, loss_head=head))
    out[head] = step(init_state(params, opt, 0), None, batch)
  _close(out["fused"][1]["loss"], out["chunked"][1]["loss"])
  _close(out["fused"][1]["grad_norm"], out["chunked"][1]["grad_norm"])
  _close(out["fused"][0]["params"], out["chunked"][0]["params"])
  with pytest.raises(ConfigError, match=r"^config.train.loss_head='liger': choose one of 'chunked', 'fused'"):
    from fineflax.train.trainable import validate
    validate(load_config("configs/quickstart.py", ["train.loss_head=liger"]))


def _grads(remat):
  params = init_params(C, jax.random.PRNGKey(1), jnp.float32)
  batch = random_sft_batch(np.random.RandomState(1), (2, 16), C.vocab_size)
  loss = lambda p: sft_nll(p, None, batch, model_config=C, lora_scale=0.0, remat=remat, dtype=jnp.float32,
                           logits_chunk=8, causal_prefix=True)[0]
  return loss, params


@pytest.mark.fast
@pytest.mark.parametrize("remat", ["attn", "matmuls", "save:mlp"])
def test_named_remat_policies_give_the_gradients_of_no_remat_and_keep_their_names(remat, capsys):
  loss, params = _grads(remat)
  _close(jax.jit(jax.grad(loss))(params), jax.jit(jax.grad(_grads("none")[0]))(params), 1e-5)
  # what the layer scan keeps: its stacked residuals [L, B, T, ...], by trailing shape (names do not cross the scan)
  jax.ad_checkpoint.print_saved_residuals(loss, params)
  prefix = f"f32[{C.num_layers},2,16,"
  kept = sorted(line.split()[0][len(prefix):-1] for line in capsys.readouterr().out.splitlines()
                if line.startswith(prefix) and "output of scan" in line)
  heads, kv, h, i = f"{C.num_heads},{C.head_dim}", f"{C.num_kv_heads},{C.head_dim}", f"{C.hidden_size}", \
      f"{C.intermediate_size}"
  shapes = {"qkv": [heads, kv, kv], "attn": [heads], "gate": [i], "up": [i], "mlp": [i]}
  want = [h] + [s for n in remat_saved_names(remat) for s in shapes[n]]  # + each layer's input
  assert kept == sorted(want), (kept, want)


@pytest.mark.fast
def test_remat_names_are_checked_in_one_line():
  validate_common(load_config("configs/quickstart.py", ["model.remat=save:qkv,attn"]))
  with pytest.raises(ConfigError, match=r"^config.model.remat='save:qkv,gates': choose one of .* or 'save:NAME,...' "
                                        r"of qkv, attn, gate, up, mlp$"):
    validate_common(load_config("configs/quickstart.py", ["model.remat=save:qkv,gates"]))


@pytest.mark.fast
def test_full_sft_in_bf16_on_a_gpu_takes_cudnn_causal_attention(monkeypatch):
  """The sft job's full-parameter step (bf16 compute, unpacked rows: causal_prefix) on a GPU backend asks for
  cuDNN's causal kernel (no mask) in every layer; traced here with the kernel swapped for XLA's."""
  calls, real = [], decoder._attention
  monkeypatch.setattr(decoder.jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(decoder, "_attention", lambda q, k, v, m, impl="xla", *a: calls.append((impl, m is None))
                      or real(q, k, v, m, "xla", *a))
  params = init_params(C, jax.random.PRNGKey(0), jnp.bfloat16)
  batch = random_sft_batch(np.random.RandomState(0), (2, 16), C.vocab_size)
  jax.make_jaxpr(jax.grad(lambda p: sft_nll(p, None, batch, model_config=C, lora_scale=0.0, dtype=jnp.bfloat16,
                                            logits_chunk=8, causal_prefix=True, loss_head="fused")[0]))(params)
  assert calls and set(calls) == {("cudnn", True)}, calls
