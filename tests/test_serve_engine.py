"""Continuous batching without HTTP: more requests than slots, mixed adapters, exact greedy parity."""
import time

import jax
import jax.numpy as jnp
import numpy as np

from fineflax import lora as L
from fineflax.models import ModelConfig, init_params
from fineflax.sampling import generate
from fineflax.serve.engine import Engine, Job


class DigitTokenizer:
  eos_token_id = None

  def decode(self, ids, skip_special_tokens=True):
    return " ".join(map(str, ids))


def _model():
  config = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=8, max_position_embeddings=256)
  rng = np.random.default_rng(0)
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
  params = jax.tree_util.tree_map_with_path(  # norms ~ 1 + N(0, 0.3), matrices ~ N(0, 0.3)
      lambda path, s: jnp.asarray(0.3 * rng.standard_normal(s.shape) + ("norm" in jax.tree_util.keystr(path)),
                                  jnp.float32), shapes)
  adapters = {}
  normal = lambda *shape: jnp.asarray(0.3 * rng.standard_normal(shape), jnp.float32)
  for name, cfg in [("a", L.LoraConfig(r=2, alpha=4.0)),
                    ("b", L.LoraConfig(r=6, alpha=3.0, target_modules=("q", "up")))]:
    shapes = config.linear_shapes()
    adapters[name] = ({t: {"a": normal(2, shapes[t][0], cfg.r), "b": normal(2, cfg.r, shapes[t][1])}
                       for t in L.resolve_targets(cfg.target_modules)}, cfg)
  return params, config, adapters


def test_more_requests_than_slots_join_as_rows_free_and_match_generate():
  params, config, adapters = _model()
  engine = Engine(params, config, DigitTokenizer(), adapters=adapters, slots=2, context=64, chunk=3,
                  dtype=jnp.float32, eos_ids=[]).start()
  events = {}
  prompts = [[5, 9, 14, 3], list(range(3, 20))]
  try:
    for p in prompts:
      for ad in (None, "a", "b"):
        engine.submit(Job(prompt=p, emit=events.setdefault((tuple(p), ad), []).append, max_tokens=7,
                          temperature=0.0, adapter=ad))
    deadline = time.time() + 120
    while time.time() < deadline and not all(any(e[0] == "done" for e in ev) for ev in events.values()):
      time.sleep(0.01)
  finally:
    engine.stop()
  assert engine.stats["max_active"] == 2 and engine.stats["mixed_adapter_calls"] > 0
  for ad in (None, "a", "b"):  # each adapter alone, all prompts in one batch
    lora, cfg = adapters[ad] if ad else (None, L.LoraConfig())
    ref = generate(params, config, prompts, max_new_tokens=7, temperature=0.0, eos_ids=(), lora=lora,
                   lora_scale=L.lora_scale(cfg), dtype=jnp.float32)
    for i, p in enumerate(prompts):
      ev = events[(tuple(p), ad)]
      assert [t for e in ev if e[0] == "delta" for t, _ in e[3]] == ref.tokens[i].tolist(), (p, ad)
      assert ev[-1] == ("done", 0, "length", 7)


def _run_jobs(engine, jobs):
  """{id(job): events} once every job is done (the engine is stopped after)."""
  events = {id(j): [] for j in jobs}
  engine.start()
  try:
    for j in jobs:
      j.emit = events[id(j)].append
      engine.submit(j)
    deadline = time.time() + 120
    while time.time() < deadline and not all(sum(e[0] == "done" for e in ev) == j.n
                                             for j, ev in zip(jobs, events.values())):
      time.sleep(0.01)
  finally:
    engine.stop()
  return events


def _tokens(events, index):
  return [t for e in events if e[0] == "delta" and e[1] == index for t, _ in e[3]]


def test_seeded_samples_depend_only_on_the_seed_not_on_the_batch():
  """A job's n samples (top-p) are the same alone and beside other jobs (another seed, another adapter,
  more samples than slots); its n samples differ from each other."""
  params, config, adapters = _model()
  make = lambda: Engine(params, config, DigitTokenizer(), adapters=adapters, slots=3, context=64, chunk=3,
                        dtype=jnp.float32, eos_ids=[])
  job = lambda **kw: Job(prompt=[5, 9, 14, 3], emit=None, max_tokens=6, temperature=1.0, top_p=0.9, **kw)
  alone = _run_jobs(make(), [job(n=2, seed=7)])
  mixed = _run_jobs(make(), [job(n=4, seed=8, adapter="a"), job(n=2, seed=7), job(n=1, seed=9)])
  (a,), (_, m, _) = alone.values(), mixed.values()
  assert [_tokens(a, i) for i in range(2)] == [_tokens(m, i) for i in range(2)]
  assert _tokens(a, 0) != _tokens(a, 1) and len(_tokens(a, 0)) == 6


def test_a_failing_row_fails_only_its_own_request():
  """Two slots. A good request shares its decode calls first with a request whose stop 'string' is not a
  string (validation refuses it; here it reaches the engine), then with one whose callback raises (a
  client gone). The first gets an error, the second has no listener; the good one ends exactly as alone."""
  params, config, _ = _model()
  engine = Engine(params, config, DigitTokenizer(), slots=2, context=64, chunk=3, dtype=jnp.float32,
                  eos_ids=[]).start()
  good, bad_stop, gone_calls = [], [], []

  def gone(event):
    gone_calls.append(event)
    raise RuntimeError("Event loop is closed")
  prompt = [5, 9, 14, 3]
  try:
    for job in (Job(prompt=prompt, emit=good.append, max_tokens=7, temperature=0.0),
                Job(prompt=prompt, emit=bad_stop.append, max_tokens=7, temperature=0.0, stop=(5,)),
                Job(prompt=prompt, emit=gone, max_tokens=7, temperature=0.0)):
      engine.submit(job)
    deadline = time.time() + 120
    while time.time() < deadline and not (good and good[-1][0] != "delta" and len(gone_calls) >= 2):
      time.sleep(0.01)
  finally:
    engine.stop()
  assert len(bad_stop) == 1 and bad_stop[0][0] == "error" and "TypeError" in bad_stop[0][1]
  assert [e[0] for e in gone_calls] == ["delta", "error"]  # its first delta raised; the error, too
  ref = generate(params, config, [prompt, list(range(3, 20))], max_new_tokens=7, temperature=0.0, eos_ids=(),
                 lora_scale=L.lora_scale(L.LoraConfig()), dtype=jnp.float32)  # the first test's shapes
  assert [t for e in good if e[0] == "delta" for t, _ in e[3]] == ref.tokens[0].tolist()
  assert good[-1] == ("done", 0, "length", 7)
  assert engine.stats["errors"] == 2 and engine.stats["max_active"] == 2 and engine.active_rows() == 0


def test_seeds_use_all_64_bits():
  """Seeds that agree in their low 32 bits draw different samples (before: jax's PRNGKey without x64 kept
  only those bits, and each pair drew the same); a seed again draws the same."""
  params, config, _ = _model()
  make = lambda: Engine(params, config, DigitTokenizer(), slots=4, context=64, chunk=3, dtype=jnp.float32,
                        eos_ids=[])
  seeds = [5, 5 + 2**32, -1, 2**32 - 1, 7, 7 + 2**40, 5]
  jobs = [Job(prompt=[5, 9, 14, 3], emit=None, max_tokens=8, temperature=1.0, seed=s) for s in seeds]
  events = list(_run_jobs(make(), jobs).values())
  got = [_tokens(ev, 0) for ev in events]
  assert not jax.config.jax_enable_x64 and all(len(t) == 8 for t in got)
  assert got[0] != got[1] and got[2] != got[3] and got[4] != got[5]
  assert got[6] == got[0]


def test_the_end_token_counts_as_completion_token_but_is_not_content():
  """A row that ends at EOS: completion_tokens counts the EOS token (it was generated, as vLLM counts it);
  the log-prob entries are the content's tokens only (OpenAI's logprobs.content), without the EOS."""
  params, config, _ = _model()
  prompt = [5, 9, 14, 3]
  ref = generate(params, config, [prompt, list(range(3, 20))], max_new_tokens=7, temperature=0.0, eos_ids=(),
                 lora_scale=L.lora_scale(L.LoraConfig()), dtype=jnp.float32).tokens[0].tolist()
  k = next(i for i in range(2, 7) if ref[i] not in ref[:i])  # the first new token from the third on: EOS
  engine = Engine(params, config, DigitTokenizer(), slots=2, context=64, chunk=3, dtype=jnp.float32,
                  eos_ids=[ref[k]])
  (ev,) = _run_jobs(engine, [Job(prompt=prompt, emit=None, max_tokens=7, temperature=0.0)]).values()
  assert ev[-1] == ("done", 0, "stop", k + 1)
  assert _tokens(ev, 0) == ref[:k]
  assert "".join(e[2] for e in ev if e[0] == "delta") == DigitTokenizer().decode(ref[:k])
