"""The decoder with a paged KV cache (`fineflax.models.paged`): sequences fed in chunks into scattered pages
give the logits of the full forward without a cache, for both decoders (scan over stacked layers, the
unrolled GPU layout) and every numerics switch (GQA, sliding windows, soft-caps, Gemma's query scale);
the Pallas kernel (interpreted on CPU) equals the gather path; the compiled decode loop updates the pool
in place (no second buffer of it)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _sampling_fixtures import EVERYTHING, LLAMA, random_params
from fineflax.models import forward
from fineflax.models.decoder import forward_hidden, logits_from_hidden
from fineflax.models.paged import init_paged_cache
from fineflax.models.unrolled import forward_unrolled, prepare_unrolled

S = 4  # page size
SEQS = [list(range(3, 17)), [40, 41, 42, 43, 44, 45, 46], [90, 7, 7, 21, 8]]
CHUNKS = [[6, 5, 3], [4, 1, 2], [2, 3]]  # tokens fed per call, per sequence (then decode steps, T = 1)
TABLE = np.array([[9, 2, 14, 5], [1, 11, 0, 0], [7, 3, 0, 0]], np.int32)  # scattered pages; 0 = trash


def _feed_in_chunks(params, config, impl, kernel="gather"):
  """Logits of every token of SEQS, fed through one paged cache in the calls of CHUNKS (blocks padded to
  one width: one compiled program; rows with no tokens in a call take part as padding)."""
  pool = init_paged_cache(config, 16, S, jnp.float32)
  run_params = prepare_unrolled(params, config, jnp.float32) if impl == "unrolled" else params

  @jax.jit
  def call(pool, tokens, positions, valid):
    cache = dict(pool, block_table=jnp.asarray(TABLE))
    kw = dict(positions=positions, attention_mask=valid, dtype=jnp.float32, paged_kernel=kernel)
    if impl == "unrolled":
      h, cache = forward_unrolled(run_params, config, tokens, cache, **kw)
    else:
      h, cache = forward_hidden(run_params, config, tokens, cache=cache, **kw)
    return logits_from_hidden(params, config, h), {"k": cache["k"], "v": cache["v"]}

  done, logits = [0] * len(SEQS), [[] for _ in SEQS]
  for step in range(max(map(len, CHUNKS))):
    sizes = [c[step] if step < len(c) else 0 for c in CHUNKS]
    width = max(map(max, CHUNKS))
    tokens, positions = np.zeros((3, width), np.int32), np.zeros((3, width), np.int32)
    valid = np.zeros((3, width), bool)
    for b, n in enumerate(sizes):
      tokens[b, :n] = SEQS[b][done[b]:done[b] + n]
      positions[b] = done[b] + np.arange(width)
      valid[b, :n] = True
    out, pool = call(pool, tokens, positions, valid)
    for b, n in enumerate(sizes):
      logits[b] += list(np.asarray(out[b, :n]))
      done[b] += n
  for _ in range(2):  # decode steps: one token per row (the Pallas kernel's case)
    tokens = np.array([[SEQS[b][done[b]] if done[b] < len(SEQS[b]) else 0] for b in range(3)], np.int32)
    valid = np.array([[done[b] < len(SEQS[b])] for b in range(3)])
    out, pool = call(pool, tokens, np.array(done, np.int32)[:, None], valid)
    for b in range(3):
      if valid[b, 0]:
        logits[b].append(np.asarray(out[b, 0]))
        done[b] += 1
  return [np.stack(x) for x in logits], done


@pytest.mark.parametrize("impl", ["scan", "unrolled"])
@pytest.mark.parametrize("name", ["everything", "llama"])
def test_paged_chunks_equal_the_full_forward(name, impl):
  config = {"everything": EVERYTHING, "llama": LLAMA}[name]
  params = random_params(config)
  got, done = _feed_in_chunks(params, config, impl)
  width = max(done)  # one right-padded batch: causal, so real tokens' logits do not see the padding
  want = np.asarray(forward(params, config, jnp.asarray([s[:n] + [0] * (width - n) for s, n in zip(SEQS, done)])))
  for b, seq in enumerate(SEQS):
    np.testing.assert_allclose(got[b], want[b, :done[b]], atol=2e-5, rtol=1e-5)


def test_pallas_kernel_equals_gather():
  """Soft-capped, scaled, GQA attention without sliding layers (the kernel's domain): same logits."""
  config = dataclasses.replace(EVERYTHING, sliding_window=None, layer_types=())
  params = random_params(config)
  gather, _ = _feed_in_chunks(params, config, "unrolled", "gather")
  pallas, _ = _feed_in_chunks(params, config, "unrolled", "pallas")
  for g, p in zip(gather, pallas):
    np.testing.assert_allclose(p, g, atol=2e-5, rtol=1e-5)


@pytest.mark.long
def test_decode_loop_updates_the_pool_in_place():
  """The compiled decode chunk's temporary memory does not grow with the pool, and the donated pool is
  its output buffer: no second buffer of the pool exists. (XLA:CPU still rewrites the whole pool in place
  at each scatter, a time that grows with the pool on CPU only; benchmarks/engine.py case a times the
  GPU's.)"""
  from fineflax.engine import device
  from fineflax.models import init_params
  from fineflax.engine.processors import RowFilters
  config = LLAMA
  sd = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), t)
  params = jax.eval_shape(lambda: init_params(config, jax.random.key(0), jnp.float32))
  b = 4
  state = {"pending": np.zeros(b, np.int32), "pos": np.zeros(b, np.int32), "budget": np.ones(b, np.int32),
           "count": np.zeros(b, np.int32), "active": np.ones(b, bool), "temperature": np.zeros(b, np.float32),
           "top_k": np.zeros(b, np.int32), "top_p": np.ones(b, np.float32), "key": np.zeros((b, 2), np.uint32),
           "eos": np.zeros((b, 4), np.int32)}
  for impl in ("scan", "unrolled"):
    p = params
    if impl == "unrolled":
      p = jax.eval_shape(lambda q: prepare_unrolled(q, config, jnp.float32), params)
    temp = []
    for pages in (40, 400):
      pool = sd(jax.eval_shape(lambda: init_paged_cache(config, pages, S, jnp.float32)))
      compiled = device.decode_chunk.lower(
          p, pool, np.zeros((b, 3), np.int32), state, None, 1.0, config=config, dtype=jnp.float32, impl=impl,
          kernel="gather", filters=RowFilters(False), num_steps=4).compile()
      mem = compiled.memory_analysis()
      pool_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(pool))
      assert mem.alias_size_in_bytes == pool_bytes, (impl, mem)
      temp.append(mem.temp_size_in_bytes)
    assert temp[0] == temp[1], (impl, temp)
