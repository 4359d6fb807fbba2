"""The Search-R1 agent function gives the built-in rollout's transitions: scripted turns (exact, with real BM25
searches, an invalid turn and the final turn) and greedy rollouts of the tiny model (same tokens, masks and
log-probs)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.agents import LocalLLM, ScriptedLLM, Store, merge_transitions, rollout_transitions, run_rollouts
from fineflax.agents.search_r1 import SearchR1Agent
from fineflax.rl.policy import Policy
from fineflax.search_r1 import (RolloutConfig, ScriptedPolicy, make_kb, make_search_fn, prompt_ids,
                                rollout_batch, run_rollouts as builtin_rollouts)

CFG = RolloutConfig(max_turns=2, max_turn_tokens=64, max_response_tokens=400, max_obs_tokens=40)


@pytest.fixture(scope="module")
def kb_search():
  from retrieval import create_search_engine
  kb = make_kb(num_people=6, num_cities=3, num_countries=2, seed=1)
  return kb, make_search_fn(create_search_engine("bm25", kb.documents), topk=2)


def _agent_rows(agent, llms, questions):
  store = Store()
  rows = []
  for q, llm in zip(questions, llms):
    (rec,) = run_rollouts(agent, [{"question": q.question, "answer": q.answer}], llm, {}, store)
    ts = rollout_transitions(rec)
    rows.append((ts, merge_transitions(ts), rec))
  return rows


@pytest.mark.fast
def test_scripted_agent_equals_builtin_rollout(kb_search):
  from fineflax.models import load_tokenizer
  tok = load_tokenizer("smollm2-135m-instruct")
  kb, search = kb_search
  qs = kb.questions[:3]
  scripts = [list(qs[0].demo),
             ["<think>hmm</think> no action here", f"<search>{qs[1].question}</search>", "<think>x</think>"],
             ["<answer>nobody</answer>"]]
  builtin = builtin_rollouts(ScriptedPolicy(tok, scripts, eos_id=2), [prompt_ids(tok, q.question, CFG) for q in qs],
                             search, tok, CFG)
  agent = SearchR1Agent(tok, search, CFG)
  got = _agent_rows(agent, [ScriptedLLM(s, tokenizer=tok, eos_id=2) for s in scripts], qs)
  assert [r.finish for r in builtin] == ["answer", "turns", "answer"]
  for q, b, (ts, merged, rec) in zip(qs, builtin, got):
    assert merged.prompt_ids == prompt_ids(tok, q.question, CFG)
    assert merged.response_ids == b.tokens and merged.loss_mask == b.loss_mask and merged.logprobs == b.logprobs
    assert len(ts) == b.num_turns  # one transition per model turn
    assert rec.reward == float(b.answer is not None and b.answer.lower() == q.answer.lower())
    searches = [s for s in rec.spans if s.kind == "tool"]
    assert [s.attributes["args"][0][0][0] for s in searches] == b.queries
  assert got[0][2].reward == 1.0 and got[2][2].reward == 0.0


def test_greedy_agent_equals_builtin_rollout(tiny_smol, kb_search):
  from fineflax.models import load
  params, config, tok = load(tiny_smol, dtype=jnp.float32)
  kb, search = kb_search
  qs = kb.questions[:2]
  cfg = RolloutConfig(max_turns=2, max_turn_tokens=8, max_response_tokens=400, max_obs_tokens=24)
  builtin = rollout_batch(params, config, tok, search, [q.question for q in qs], cfg, temperature=0.0,
                          dtype=jnp.float32)
  policy = Policy(params, config, tok, None, 1.0, jnp.float32, temperature=1.0, max_new_tokens=8)
  llm = LocalLLM(policy, jax.random.key(0))
  got = _agent_rows(SearchR1Agent(tok, search, cfg, temperature=0.0), [llm] * len(qs), qs)
  assert sum(len(b.tokens) for b in builtin) > 20 and any(0.0 in b.loss_mask for b in builtin)  # text was inserted
  for b, (ts, merged, rec) in zip(builtin, got):
    assert merged.response_ids == b.tokens and merged.loss_mask == b.loss_mask
    assert len(ts) == b.num_turns
    # greedy: sampling log-probs are 0; the untempered policy log-probs equal the built-in's
    raw = [x for s in rec.spans if s.kind == "llm" for x in s.attributes["raw_logprobs"]]
    np.testing.assert_allclose(raw, np.array(b.logprobs)[np.array(b.loss_mask) == 1], atol=2e-4)
  llm.close()
