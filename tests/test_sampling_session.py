"""SamplerSession: appending tool output into the cache, then decoding on == decoding from scratch."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from _sampling_fixtures import CharTokenizer, tiny_llama
from fineflax.sampling import SamplerSession, generate

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [30, 31]]


def _session(max_total_len=64, **kw):
  _, params, config = tiny_llama()
  return SamplerSession(params, config, max_total_len=max_total_len, temperature=0.0, eos_ids=(),
                        dtype=jnp.float32, **kw)


def _scratch(prompt, n, **kw):
  """Greedy tokens from a fresh generate() call on the whole sequence."""
  _, params, config = tiny_llama()
  return generate(params, config, [prompt], max_new_tokens=n, temperature=0.0, eos_ids=(),
                  dtype=jnp.float32, **kw)


def test_append_then_continue_equals_decoding_the_concatenation_from_scratch():
  s = _session()
  s.start(PROMPTS)
  s.decode(6)
  first = s.result()
  inserted = {0: [40, 41, 42], 2: [50]}  # row 1 gets nothing: it stays finished
  s.append(inserted)
  s.decode(8)
  out = s.result()
  assert out.finish_reason == ["length"] * 3
  for b, p in enumerate(PROMPTS):
    head = first.tokens[b, :6].tolist()
    if b not in inserted:
      assert out.lengths[b] == 6 and out.tokens[b, :6].tolist() == head
      continue
    extra = inserted[b]
    k = len(extra)
    assert out.lengths[b] == 6 + k + 8
    np.testing.assert_array_equal(out.tokens[b, :6 + k], head + extra)
    assert out.mask[b, :6].all() and not out.mask[b, 6:6 + k].any() and out.mask[b, 6 + k:6 + k + 8].all()
    assert out.valid[b, :6 + k + 8].all() and not out.valid[b, 6 + k + 8:].any()
    np.testing.assert_array_equal(out.logprobs[b, 6:6 + k], 0.0)
    ref = _scratch(p + head + extra, 8)
    np.testing.assert_array_equal(out.tokens[b, 6 + k:6 + k + 8], ref.tokens[0])
    np.testing.assert_allclose(out.raw_logprobs[b, 6 + k:6 + k + 8], ref.raw_logprobs[0], atol=2e-4)


def test_append_after_stop_string_continues_from_the_stop():
  tok = CharTokenizer()
  ref = _scratch(PROMPTS[0], 16).tokens[0]
  stop = tok.decode(ref)[6:8]
  n = next(k for k in range(1, 17) if stop in tok.decode(ref[:k]))
  s = _session(tokenizer=tok, chunk_size=4)  # the stop lands mid-chunk: later cache slots are dropped
  s.start(PROMPTS[:1])
  s.decode(16, stop_strings=(stop,))
  assert s.result().finish_reason == ["stop"] and s.result().lengths[0] == n
  s.append([[60, 61]])
  s.decode(6)
  out = s.result()
  assert out.lengths[0] == n + 2 + 6
  expect = _scratch(PROMPTS[0] + ref[:n].tolist() + [60, 61], 6).tokens[0]
  np.testing.assert_array_equal(out.tokens[0, n + 2:n + 8], expect)


def test_append_beyond_the_reserved_length_is_an_error():
  s = _session(max_total_len=16)
  s.start(PROMPTS[:1])
  s.decode(4)
  with pytest.raises(ValueError, match="do not fit.*raise max_total_len"):
    s.append([list(range(3, 40))])
  with pytest.raises(ValueError, match=r"row 5 out of range"):
    s.append({5: [3]})
  with pytest.raises(RuntimeError, match="start"):
    _session().decode(4)
