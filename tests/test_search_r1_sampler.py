"""The rollout loop on the real sampler (tiny random model, SmolLM2 tokenizer, in-process BM25): inserted
tokens have mask 0, the loop's record equals the session's, and every generated token's log-prob equals
a from-scratch forward over the whole sequence (the cache continued correctly across appends)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.models import ModelConfig, init_params
from fineflax.rl.batch import build_rl_batch
from fineflax.rl.step import completion_logp
from fineflax.search_r1 import (INVALID_ACTION_TEXT, ReasoningWithSearch, RolloutConfig, SamplerPolicy,
                                make_kb, make_search_fn, prompt_ids, run_rollouts, session_length)

CFG = ModelConfig(vocab_size=49152, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, eos_token_ids=(2,))


@pytest.fixture(scope="module")
def setup():
  from fineflax.models import load_tokenizer
  from retrieval import create_search_engine
  tok = load_tokenizer("smollm2-135m-instruct")
  kb = make_kb(num_people=6, num_cities=3, num_countries=2, seed=1)
  return init_params(CFG, jax.random.PRNGKey(0), std=0.3), tok, kb, create_search_engine("bm25", kb.documents)


def test_sampler_rollout_masks_and_continuation(setup):
  params, tok, kb, engine = setup
  cfg = RolloutConfig(max_turns=2, max_turn_tokens=6, max_response_tokens=200)
  questions = [q.question for q in kb.questions[:3]]
  prompts = [prompt_ids(tok, q, cfg) for q in questions]
  policy = SamplerPolicy(params, CFG, tok, max_total_len=session_length(cfg), temperature=0.0,
                         dtype=jnp.float32, chunk_size=4)
  rows = run_rollouts(policy, prompts, make_search_fn(engine), tok, cfg)
  out = policy.session.result()
  for b, row in enumerate(rows):
    n = int(out.lengths[b])
    assert row.tokens == out.tokens[b, :n].tolist()  # the loop's record = what the session holds
    assert row.loss_mask == out.mask[b, :n].astype(float).tolist()
    assert row.num_turns == 3 and row.finish in ("turns", "answer", "length")
    inserted = np.flatnonzero(np.array(row.loss_mask) == 0)
    if row.num_invalid:
      assert len(inserted) > 0 and INVALID_ACTION_TEXT in row.trace
  assert sum(r.num_invalid + len(r.queries) for r in rows) > 0  # something was inserted
  batch = build_rl_batch(prompts, [r.tokens for r in rows], [r.loss_mask for r in rows], pad_id=0,
                         width_multiple=8)
  ref, _ = completion_logp(None, params, {k: jnp.asarray(v) for k, v in batch.items()}, model_config=CFG)
  ref = np.asarray(ref)
  for b, row in enumerate(rows):
    m = np.array(row.loss_mask) == 1
    np.testing.assert_allclose(np.array(row.logprobs)[m], ref[b, :len(row.tokens)][m], atol=2e-4)


def test_reasoning_with_search_runs_end_to_end(setup):
  params, tok, kb, engine = setup
  rws = ReasoningWithSearch(params, CFG, tok, engine, rollout=RolloutConfig(max_turns=1, max_turn_tokens=4),
                            dtype=jnp.float32)
  results = rws.reason_batch([kb.questions[0].question, kb.questions[1].question])
  one = rws.reason(kb.questions[0].question)
  assert len(results) == 2 and one.trace == results[0].trace  # greedy: batch and single agree
  assert one.num_turns == 2 and one.answer is None and one.queries == []
