"""generate(): greedy parity with transformers on left-padded batches, EOS and stop strings per row."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _sampling_fixtures import CharTokenizer, hf_greedy, tiny_llama
from fineflax.sampling import generate

pytestmark = pytest.mark.fast

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [30, 31]]


def _greedy(prompts, n, **kw):
  _, params, config = tiny_llama()
  kw.setdefault("eos_ids", ())
  return generate(params, config, prompts, max_new_tokens=n, temperature=0.0, dtype=jnp.float32, **kw)


def test_greedy_matches_transformers_left_padded():
  model, _, _ = tiny_llama()
  out = _greedy(PROMPTS, 32)  # 3 rows: batch bucket 4 adds a padding row
  np.testing.assert_array_equal(out.tokens, hf_greedy(model, PROMPTS, 32))
  assert out.finish_reason == ["length"] * 3
  assert out.mask.all() and out.valid.all() and list(out.lengths) == [32] * 3
  assert list(out.prompt_lengths) == [5, 11, 2]


def test_array_prompts_with_mask_equal_token_lists():
  width = max(len(p) for p in PROMPTS)
  arr = np.array([[0] * (width - len(p)) + p for p in PROMPTS])
  mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
  np.testing.assert_array_equal(_greedy(arr, 24, prompt_mask=mask).tokens, _greedy(PROMPTS, 24).tokens)


def test_eos_stops_each_row_at_its_first_eos():
  ref = _greedy(PROMPTS, 24).tokens
  eos = int(ref[0, 5])
  out = _greedy(PROMPTS, 24, eos_ids=(eos,))
  for b in range(len(PROMPTS)):
    hits = np.flatnonzero(ref[b] == eos)
    n = int(hits[0]) + 1 if hits.size else 24
    assert out.finish_reason[b] == ("eos" if hits.size else "length")
    assert out.lengths[b] == n
    np.testing.assert_array_equal(out.tokens[b, :n], ref[b, :n])
    assert out.mask[b, :n].all() and not out.mask[b, n:].any() and not out.tokens[b, n:].any()


def test_stop_strings_truncate_each_row_at_first_occurrence():
  tok = CharTokenizer()
  ref = _greedy(PROMPTS, 24).tokens
  texts = [tok.decode(r) for r in ref]
  # Stop strings taken from the middle of rows 0 and 1 (they may straddle token boundaries).
  stops = (texts[0][9:12], texts[1][14:16])
  out = _greedy(PROMPTS, 24, stop_strings=stops, tokenizer=tok, chunk_size=8)
  assert out.finish_reason[:2] == ["stop", "stop"]
  for b in range(len(PROMPTS)):
    ends = [texts[b].find(s) + len(s) for s in stops if s in texts[b]]
    if not ends:
      assert out.finish_reason[b] == "length" and out.lengths[b] == 24
      assert out.texts[b] == texts[b]
      continue
    n = next(k for k in range(1, 25) if any(s in tok.decode(ref[b, :k]) for s in stops))
    assert out.finish_reason[b] == "stop"
    assert out.lengths[b] == n
    np.testing.assert_array_equal(out.tokens[b, :n], ref[b, :n])
    assert out.mask[b, :n].all() and not out.mask[b, n:].any()
    assert out.texts[b] == texts[b][:min(ends)]


def test_bad_inputs_give_clear_errors():
  _, params, config = tiny_llama()
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    _greedy([[3], []], 4)
  with pytest.raises(ValueError, match=r"prompt 0: token ids \[96\] outside the vocabulary"):
    _greedy([[3, 96]], 4)
  with pytest.raises(ValueError, match="need a tokenizer"):
    _greedy([[3]], 4, stop_strings=("x",))
  with pytest.raises(ValueError, match="pass rng"):
    generate(params, config, [[3]], max_new_tokens=4, temperature=1.0)
  with pytest.raises(ValueError, match=r"max_new_tokens=0\): must be an integer >= 1"):
    generate(params, config, [[3]], max_new_tokens=0)
  with pytest.raises(ValueError, match="top_p=0"):
    generate(params, config, [[3]], max_new_tokens=4, top_p=0.0, rng=jax.random.key(0))
