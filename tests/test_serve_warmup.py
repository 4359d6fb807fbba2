"""Server warm-up (issue 30): after `Engine.warm_up` a burst of mixed requests compiles nothing; the compile
counter behind /health counts the compiles a cold engine does; the --warmup flag parses."""
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.engine.compiles import CompileCounter
from fineflax.models import ModelConfig, init_params
from fineflax.serve.__main__ import parse_args
from fineflax.serve.engine import Engine, Job


class DigitTokenizer:
  eos_token_id = None

  def decode(self, ids, skip_special_tokens=True):
    return " ".join(map(str, ids))


def _engine(chunk):
  config = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                       num_kv_heads=1, head_dim=8, max_position_embeddings=64)
  rng = np.random.default_rng(0)
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
  params = jax.tree.map(lambda s: np.asarray(0.3 * rng.standard_normal(s.shape), np.float32), shapes)
  return Engine(params, config, DigitTokenizer(), slots=2, context=40, dtype=jnp.float32, chunk=chunk,
                eos_ids=[3], prefix_cache=True)


def _burst(engine):
  """Waves of 1 and 2 concurrent jobs (slots = 2): greedy, sampled, top-p, n = 2 (shared prompt pages),
  prompts of 1 to 30 tokens (prefill blocks of 16 and 32), up to 8 new tokens; waits for all."""
  settings = [dict(temperature=0.0), dict(temperature=1.0, seed=1), dict(temperature=0.8, top_p=0.5, seed=2),
              dict(temperature=1.0, n=2, seed=3)]
  rng = np.random.default_rng(0)
  waves = [[0], [1], [2], [3], [0, 1], [1, 2], [2, 0], [0, 3], [2, 3]]
  for w, wave in enumerate(waves):
    done, jobs = threading.Semaphore(0), []
    for i in wave:
      length = [1, 9, 17, 30][(w + i) % 4]
      prompt = rng.integers(4, 64, length).tolist()
      job = Job(prompt=prompt, max_tokens=[8, 3][w % 2], emit=lambda ev, done=done: (
          ev[0] == "done" or ev[0] == "error") and done.release(), **settings[i])
      jobs.append(job)
      engine.submit(job)
    for job in jobs:
      for _ in range(job.n):
        assert done.acquire(timeout=120)
    assert engine.stats["errors"] == 0


@pytest.mark.fast
def test_the_warmup_flag_parses_and_is_documented(capsys):
  assert parse_args(["--model", "m"]).warmup is None  # default: on unless the backend is the CPU
  assert parse_args(["--model", "m", "--warmup"]).warmup is True
  assert parse_args(["--model", "m", "--no-warmup"]).warmup is False
  with pytest.raises(SystemExit):
    parse_args(["--help"])
  assert "--warmup, --no-warmup" in capsys.readouterr().out


def test_after_warmup_a_mixed_burst_compiles_nothing():
  warm = _engine(chunk=4)  # first: nothing of the burst (not even a host-to-device transfer) compiled before
  counter = CompileCounter()
  n, seconds, compiled = warm.warm_up()
  assert n == len(warm.driver.engine.serving_programs(40)) and seconds > 0 and compiled >= n
  counter.start()
  warm.start()
  try:
    _burst(warm)
  finally:
    warm.stop()
  assert (counter.count, counter.seconds) == (0, 0.0)
  assert warm.compile_totals()[0] >= n
  cold = _engine(chunk=3).start()  # another chunk size: programs the warm engine did not compile
  counter.start()
  try:
    _burst(cold)
  finally:
    cold.stop()
  assert counter.count >= len(cold.driver.engine.programs) > 0  # a cold engine compiles while serving


@pytest.mark.fast
def test_coarse_buckets_are_the_smallest_power_of_4_steps_and_powers_of_2():
  from fineflax.engine.device import page_bucket, row_bucket
  for minimum in (1, 3, 8):
    m = row_bucket(minimum)
    for n in range(1, 300):
      b = row_bucket(n, minimum, base=4)
      k = next(k for k in range(10) if m * 4 ** k >= n)
      assert b == m * 4 ** k, (n, minimum, b)
  for n in range(1, 300):
    p = page_bucket(n, steps=1)
    assert p >= n and p & (p - 1) == 0 and p < 2 * n
    assert page_bucket(n, limit=40, steps=1) == min(p, max(40, n))
