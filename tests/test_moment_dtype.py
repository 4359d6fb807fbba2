"""AdamW moments stored in bfloat16 (config.train.moment_dtype, `fineflax.train.optim.with_f32_state`): the
state's dtype and bytes, one update against the float32 reference rounded, the config check, and a 200-step
full-parameter run on real text whose loss curve stays within the seed-to-seed noise of float32 moments."""
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fineflax.config_checks import ConfigError
from fineflax.jobs.resolve import load_config
from fineflax.models import ModelConfig, init_params
from fineflax.train import trainable as T
from fineflax.train.optim import make_optimizer, with_f32_state
from fineflax.train.sft_step import make_sft_fns
from fineflax.train.state import init_state

SAMPLES = pathlib.Path(__file__).resolve().parents[1] / "fineflax" / "data" / "samples" / "world_alpaca.jsonl"


def _leaves(state):
  return [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]


@pytest.mark.fast
def test_bf16_moments_halve_the_state_and_round_the_float32_update():
  p = {"w": jax.random.normal(jax.random.PRNGKey(0), (4, 8)).astype(jnp.bfloat16)}
  g = {"w": 1e-3 * jax.random.normal(jax.random.PRNGKey(1), (4, 8)).astype(jnp.bfloat16)}
  inner = optax.adamw(1e-2, weight_decay=0.1)
  f32, b16 = with_f32_state(inner), with_f32_state(inner, "bfloat16")
  s32, s16 = f32.init(p), b16.init(p)
  assert {x.dtype for x in _leaves(s16)} == {jnp.dtype(jnp.bfloat16)}
  assert sum(x.nbytes for x in _leaves(s16)) * 2 == sum(x.nbytes for x in _leaves(s32))
  u32, n32 = f32.update(g, s32, p)
  u16, n16 = b16.update(g, s16, p)
  # from a zero state the first update is computed in f32 either way; only the stored moments are rounded
  np.testing.assert_array_equal(np.asarray(u16["w"]), np.asarray(u32["w"]))
  for a, b in zip(_leaves(n16), _leaves(n32)):
    assert a.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b.astype(jnp.bfloat16)))
  # the next update reads the rounded moments as f32: equal to the f32 optimizer fed those rounded moments
  rounded = jax.tree.map(lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, n16)
  want, _ = f32.update(g, rounded, p)
  got, _ = b16.update(g, n16, p)
  np.testing.assert_array_equal(np.asarray(got["w"]), np.asarray(want["w"]))


@pytest.mark.fast
def test_moment_dtype_is_checked_in_the_config_and_the_optimizer():
  config = load_config("configs/quickstart.py", ["train.moment_dtype=bfloat16"])
  assert T.moment_dtype(config) == "bfloat16"
  with pytest.raises(ConfigError, match=r"^config.train.moment_dtype='float16': choose one of 'float32', 'bfloat16'"):
    T.validate(load_config("configs/quickstart.py", ["train.moment_dtype=float16"]))
  with pytest.raises(ValueError, match=r"moment_dtype='int8'"):
    make_optimizer(None, "int8")


TINY = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, tie_word_embeddings=True)
STEPS, BATCH, SEQ, WINDOW = 200, 8, 64, 20


def _text_bytes() -> np.ndarray:
  """The bundled world_alpaca samples as UTF-8 bytes (real English text; a byte is a token)."""
  rows = [json.loads(line) for line in SAMPLES.read_text().splitlines() if line.strip()]
  text = "\n\n".join(" ".join(str(r.get(k, "")) for k in ("instruction", "input", "output")) for r in rows)
  return np.frombuffer(text.encode(), np.uint8).astype(np.int32)


def _loss_curve(moment_dtype: str, seed: int) -> np.ndarray:
  """Per-step training loss of a full-parameter run: bf16 parameters and compute, AdamW (lr 3e-3, b2 0.999,
  clip 1), `seed` picking the initial weights and the order of the text windows."""
  data = _text_bytes()
  cfg = type("Opt", (), dict(learning_rate=3e-3, warmup_steps=10, num_steps=STEPS, end_lr_ratio=0.1,
                             weight_decay=0.0, b1=0.9, b2=0.999, grad_clip=1.0))
  optimizer = make_optimizer(cfg, moment_dtype)
  train, _ = make_sft_fns(optimizer, donate=True, model_config=TINY, lora_scale=0.0, dtype=jnp.bfloat16,
                          logits_chunk=SEQ, causal_prefix=True)
  state = init_state(init_params(TINY, jax.random.PRNGKey(seed), dtype=jnp.bfloat16), optimizer, seed)
  rng = np.random.default_rng(seed)
  ones = np.ones((1, BATCH, SEQ), np.int32)
  positions = np.broadcast_to(np.arange(SEQ, dtype=np.int32), ones.shape).copy()
  losses = []
  for _ in range(STEPS):
    starts = rng.integers(0, len(data) - SEQ - 1, BATCH)
    window = np.stack([data[s:s + SEQ + 1] for s in starts])[None]
    batch = {"tokens": window[..., :-1], "targets": window[..., 1:], "loss_mask": ones.astype(np.float32),
             "attention_mask": ones, "positions": positions, "segment_ids": ones}
    state, metrics = train(state, None, batch)
    losses.append(metrics["loss"])
  return np.asarray(jax.device_get(losses), np.float64)


def test_bf16_moments_train_within_the_noise_of_f32_moments_over_200_steps():
  """Noise: the spread (max - min) of the 20-step mean losses of three f32-moment runs of seeds 0, 1, 2
  (initial weights and data order), its largest value over the 10 windows (about 0.6 nats here: seed 2 learns
  later). The bf16-moment runs of seeds 0 and 1 must stay within that of the f32 run of the same seed in every
  window (measured: at most about 0.07 nats, the bf16 runs a little behind in the middle windows), and every
  run must learn (its last window at least 1 nat under its first)."""
  means = lambda c: c.reshape(-1, WINDOW).mean(axis=1)
  f32 = np.stack([means(_loss_curve("float32", s)) for s in (0, 1, 2)])
  b16 = np.stack([means(_loss_curve("bfloat16", s)) for s in (0, 1)])
  noise = (f32.max(axis=0) - f32.min(axis=0)).max()
  gap = np.abs(b16 - f32[:2]).max()
  assert np.all(f32[:, -1] < f32[:, 0] - 1.0) and np.all(b16[:, -1] < b16[:, 0] - 1.0), (f32, b16)
  assert gap <= noise, f"bf16 moments off f32 by {gap:.4f} nats (20-step means), seed noise {noise:.4f}"
