"""LLM clients of agents: the in-process engine (traced token ids and log-probs equal the sampler's; concurrent
calls batched, each call's log-probs equal a teacher-forced forward; a continued context resumes its pages) and an OpenAI-compatible HTTP endpoint
(a stub server on 127.0.0.1)."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fineflax.agents import LocalLLM, OpenAILLM, Store, Tracer, run_rollouts, tracing
from fineflax.rl.batch import build_rl_batch
from fineflax.rl.policy import Policy
from fineflax.rl.step import completion_logp
from fineflax.sampling import generate

T = 0.8


@pytest.fixture(scope="module")
def policy(tiny_smol):
  from fineflax.models import load
  params, config, tok = load(tiny_smol, dtype=jnp.float32)
  return Policy(params, config, tok, None, 1.0, jnp.float32, temperature=T, top_p=1.0, max_new_tokens=8)


def test_traced_call_equals_the_sampler(policy):
  llm = LocalLLM(policy, jax.random.key(3))
  messages = [{"role": "user", "content": "What is 2 + 3?"}]
  tracer = Tracer("r", "a")
  with tracing(tracer):
    c = llm.chat(messages)
  (span,) = tracer.spans
  a = span.attributes
  prompt = llm.prompt_ids(messages)
  ref = generate(policy.base, policy.model_config, [prompt], max_new_tokens=8, temperature=T,
                 tokenizer=policy.tokenizer, rng=jax.random.fold_in(jax.random.key(3), 0), dtype=jnp.float32)
  n = int(ref.lengths[0])
  assert a["prompt_ids"] == prompt and a["response_ids"] == ref.tokens[0, :n].tolist() == c.response_ids
  assert a["logprobs"] == ref.logprobs[0, :n].tolist() and a["raw_logprobs"] == ref.raw_logprobs[0, :n].tolist()
  assert a["text"] == ref.texts[0] and span.kind == "llm"
  llm.close()


def test_concurrent_calls_are_batched_and_logprobs_match_a_forward(policy):
  llm = LocalLLM(policy, jax.random.key(5), context=256)

  def agent(task, llm, resources):
    llm.chat([{"role": "user", "content": task["q"]}], max_tokens=6)
    return 0.0

  def until_queued(engine, n=4, timeout=60.0):  # holds the engine thread until the 4 calls wait, so that a loaded
    deadline = time.monotonic() + timeout     # machine cannot finish one call before the next is submitted
    while llm.driver.queued < n and time.monotonic() < deadline:
      time.sleep(0.005)

  llm.driver.call(until_queued)
  store = Store()
  recs = run_rollouts(agent, [{"q": f"Add {i} and {i + 1}."} for i in range(4)], llm, {}, store, num_workers=4)
  llm.driver.call(lambda engine: None).result(60)  # after the last step's after_step: its decode rows are counted
  assert max(llm.batch_sizes) > 1 and llm.calls == 4  # calls shared decode steps
  spans = [s.attributes for r in recs for s in r.spans if s.kind == "llm"]
  batch = build_rl_batch([s["prompt_ids"] for s in spans], [s["response_ids"] for s in spans],
                         [[1.0] * len(s["response_ids"]) for s in spans], pad_id=0, width_multiple=8)
  ref, _ = completion_logp(None, policy.base, {k: jnp.asarray(v) for k, v in batch.items()},
                           model_config=policy.model_config, temperature=T)
  for i, s in enumerate(spans):
    np.testing.assert_allclose(s["logprobs"], np.asarray(ref)[i, :len(s["response_ids"])], atol=2e-4)
  assert [s.attributes["response_ids"] for s in store.spans(kind="llm", rollout_id=recs[0].rollout_id)] == [spans[0]["response_ids"]]
  llm.close()


def test_a_continued_context_resumes_its_pages_and_equals_a_fresh_call(policy):
  """An agent's second turn (prompt + first answer + tool output) appends only the tool output to the
  first call's sequence; greedy, it answers exactly what a fresh engine answers on the whole context."""
  llm = LocalLLM(policy, jax.random.key(0), context=256)
  prompt = llm.prompt_ids([{"role": "user", "content": "What is 2 + 3?"}])
  first = llm.complete(prompt, max_tokens=6, temperature=0.0)
  context = prompt + first.response_ids + [7, 8, 9]
  second = llm.complete(context, max_tokens=6, temperature=0.0)
  assert llm.reused == 1 and llm.calls == 1
  prefilled = llm.driver.engine.stats["prefill_tokens"]
  # the answer's tokens went into the cache as they were decoded: only the 3 new ones are fed (the last
  # answer token and 2 of them; the last one is the pending token), not the 46-token context again
  assert prefilled == len(prompt) - 1 + 3
  fresh = LocalLLM(policy, jax.random.key(0), context=256)
  ref = fresh.complete(context, max_tokens=6, temperature=0.0)
  assert second.response_ids == ref.response_ids and second.text == ref.text and second.prompt_ids == context
  np.testing.assert_allclose(second.raw_logprobs, ref.raw_logprobs, atol=1e-5)
  llm.close()
  fresh.close()


class _Stub(BaseHTTPRequestHandler):
  """OpenAI-compatible stub: fixed replies with vLLM-style token ids and log-probs; records requests."""
  requests: list = []

  def log_message(self, *args):
    pass

  def do_POST(self):
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    _Stub.requests.append((self.path, body))
    if self.path.endswith("/chat/completions"):
      out = {"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
             "prompt_token_ids": [1, 2, 3],
             "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [7, 8],
                          "message": {"role": "assistant", "content": "hi!"},
                          "logprobs": {"content": [{"token": "hi", "logprob": -0.5, "bytes": None, "top_logprobs": []},
                                                   {"token": "!", "logprob": -1.25, "bytes": None, "top_logprobs": []}]}}]}
    else:
      out = {"id": "c2", "object": "text_completion", "created": 0, "model": body["model"],
             "choices": [{"index": 0, "finish_reason": "length", "text": " four", "token_ids": [9],
                          "logprobs": {"tokens": [" four"], "token_logprobs": [-0.1], "top_logprobs": None,
                                       "text_offset": [0]}}]}
    data = json.dumps(out).encode()
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


def test_openai_http_client_against_a_stub_server():
  server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    llm = OpenAILLM(f"http://127.0.0.1:{server.server_port}/v1", "stub-model", temperature=0.5)
    tracer = Tracer("r", "a")
    with tracing(tracer):
      c = llm.chat([{"role": "user", "content": "hello"}], max_tokens=4, stop="</calc>")
      d = llm.complete([5, 6], max_tokens=1)
      e = llm.chat.completions.create(model="x", messages=[{"role": "user", "content": "again"}])
    assert (c.text, c.prompt_ids, c.response_ids, c.logprobs) == ("hi!", [1, 2, 3], [7, 8], [-0.5, -1.25])
    assert (d.text, d.prompt_ids, d.response_ids, d.logprobs, d.finish_reason) == (" four", [5, 6], [9], [-0.1], "length")
    assert e.choices[0].message.content == "hi!" and e.choices[0].token_ids == [7, 8]
    assert [s.attributes["response_ids"] for s in tracer.spans] == [[7, 8], [9], [7, 8]]
    path, body = _Stub.requests[0]
    assert path == "/v1/chat/completions" and body["max_tokens"] == 4 and body["stop"] == ["</calc>"]
    assert body["temperature"] == 0.5 and body["logprobs"] is True and body["return_token_ids"] is True
    assert _Stub.requests[1][1]["prompt"] == [5, 6]
  finally:
    server.shutdown()
