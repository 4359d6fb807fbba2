"""The OpenAI-compatible server, driven by the real `openai` client over HTTP on 127.0.0.1."""
import json
import socket
import statistics
import threading
import time
import urllib.error
import urllib.request

import jax
import jax.numpy as jnp
import numpy as np
import openai
import pytest

from fineflax.testing.serve import free_port, server_argv, thread_server, tiny_chat_model, write_adapters

KEY = "test-key"
MSG = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  root = tmp_path_factory.mktemp("serve")
  model = tiny_chat_model(root)
  adapters = write_adapters(model, root)
  argv = server_argv(model, adapters, root / "log.sqlite", free_port(), "--api-key", KEY, "--idle-timeout", "2")
  with thread_server(argv) as (url, server):
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    yield {"url": url, "server": server, "client": client, "model": model, "adapters": adapters}


def http(url, path, body=None, key=KEY, raw=None, method=None):
  """(status, parsed JSON) of one request; `raw` bytes are sent as they are."""
  data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
  req = urllib.request.Request(url + path, data=data, method=method or ("GET" if data is None else "POST"),
                               headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(req, timeout=120) as r:
      return r.status, json.loads(r.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


def test_models_list_and_bearer_auth(served):
  assert [m.id for m in served["client"].models.list().data] == ["tiny", "alpha", "beta", "auto"]
  bad = openai.OpenAI(base_url=served["url"] + "/v1", api_key="wrong", max_retries=0)
  with pytest.raises(openai.AuthenticationError):
    bad.models.list()
  assert http(served["url"], "/health", key="wrong")[0] == 200


def test_nonstreaming_and_streaming_agree_and_count_usage(served):
  c, tok = served["client"], served["server"].engine.tokenizer
  r = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=10, temperature=0, logprobs=True)
  assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == "tiny"
  from fineflax.sampling import format_chat
  n_prompt = len(tok(format_chat(tok, MSG), add_special_tokens=False)["input_ids"])
  assert r.usage.prompt_tokens == n_prompt
  assert r.usage.total_tokens == n_prompt + r.usage.completion_tokens
  assert 1 <= r.usage.completion_tokens <= 10
  assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens
  assert all(e.logprob <= 0 for e in r.choices[0].logprobs.content)
  stream = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=10, temperature=0, stream=True,
                                     stream_options={"include_usage": True})
  chunks = list(stream)
  assert chunks[0].choices[0].delta.role == "assistant"
  text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
  assert text == r.choices[0].message.content
  finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
  assert finals == [r.choices[0].finish_reason]
  assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
  assert len({ch.id for ch in chunks}) == 1


def test_n_choices_are_seeded_and_each_logged(served):
  c = served["client"]
  kw = dict(model="alpha", messages=MSG, max_tokens=8, temperature=1.0, n=3, seed=7)
  a, b = c.chat.completions.create(**kw), c.chat.completions.create(**kw)
  texts = [ch.message.content for ch in a.choices]
  assert [ch.index for ch in a.choices] == [0, 1, 2]
  assert texts == [ch.message.content for ch in b.choices]  # same seed, same samples
  assert len(set(texts)) > 1  # the choices are different draws
  status, out = http(served["url"], "/feedback", {"id": f"{a.id}/2", "reward": 1.0})
  assert status == 200 and out["variant"] == "alpha"
  log = served["server"].log
  rows = log.db.execute("SELECT id, answer, completion_tokens FROM responses WHERE id LIKE ? ORDER BY choice",
                        (a.id + "%",)).fetchall()
  assert [r[1] for r in rows] == texts and sum(r[2] for r in rows) == a.usage.completion_tokens


def test_two_adapters_in_one_batch_match_generate_alone(served):
  from fineflax.lora import import_peft, lora_scale
  from fineflax.models import load, quantize_params
  from fineflax.sampling import format_chat, generate
  c, engine = served["client"], served["server"].engine
  mixed_before = engine.stats["mixed_adapter_calls"]
  results = {}

  def ask(model):
    results[model] = c.chat.completions.create(model=model, messages=MSG, max_tokens=24, temperature=0)
  threads = [threading.Thread(target=ask, args=(m,)) for m in ("tiny", "alpha", "beta")]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert engine.stats["mixed_adapter_calls"] > mixed_before  # rows of different adapters shared a step
  params, config, tok = load(served["model"])
  base = quantize_params(params, kind="nf4")
  prompt = tok(format_chat(tok, MSG), add_special_tokens=False)["input_ids"]
  texts = set()
  for model in ("tiny", "alpha", "beta"):
    lora, scale = (None, 1.0)
    if model != "tiny":
      lora, cfg = import_peft(served["adapters"][model], config)
      scale = lora_scale(cfg)
    ref = generate(base, config, [prompt], max_new_tokens=24, temperature=0.0, tokenizer=tok, lora=lora,
                   lora_scale=scale, dtype=jnp.float32)
    got = results[model]
    assert got.choices[0].message.content == ref.texts[0], model
    assert got.usage.completion_tokens == int(ref.lengths[0]), model
    texts.add(ref.texts[0])
  assert len(texts) == 3  # the adapters really change the answers


def test_malformed_requests_get_4xx_and_the_server_keeps_serving(served):
  url = served["url"]
  ok = {"model": "tiny", "messages": MSG, "max_tokens": 2}
  cases = [
      (dict(raw=b"{not json"), 400),
      (dict(body={**ok, "model": "nope"}), 404),
      (dict(body={**ok, "max_tokens": -5}), 400),
      (dict(body={**ok, "max_tokens": 10_000}), 400),
      (dict(body={**ok, "messages": []}), 400),
      (dict(body={**ok, "temperature": "hot"}), 400),
      (dict(body={**ok, "messages": [{"role": "user", "content": "x" * 20}] * 40}), 400),  # over the context
      (dict(raw=b'{"model": "tiny", "pad": "' + b"x" * (10 << 20) + b'"}'), 413),
      (dict(raw=b'{"model": "tiny", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), 400),  # too deep
      (dict(body={**ok, "stop": ""}), 400),
      (dict(body={**ok, "stop": ["ok", ""]}), 400),
  ]
  for kw, want in cases:
    status, body = http(url, "/v1/chat/completions", **kw)
    assert status == want, (kw.get("body"), status, body)
    assert body["error"]["message"] and body["error"]["type"] == "invalid_request_error"
  assert http(url, "/feedback", {"id": "chatcmpl-unknown", "reward": 1})[0] == 404
  assert http(url, "/feedback", {"id": "chatcmpl-unknown", "reward": "good"})[0] == 400
  status, body = http(url, "/v1/chat/completions", ok)
  assert status == 200 and body["usage"]["completion_tokens"] >= 1
  for reward in (1e200, 2, -1.5, float("nan"), float("inf")):  # the default range is [-1, 1]
    status, err = http(url, "/feedback", {"id": body["id"], "reward": reward})
    assert status == 400 and "[-1, 1]" in err["error"]["message"], (reward, status, err)
  assert http(url, "/rl/stats")[0] == 200


def test_an_empty_stop_string_fails_only_its_own_request(served, monkeypatch):
  """A long streaming answer (ignore_eos) is in flight while requests with empty stop strings come: they
  get 400, the stream ends normally (before: the engine failed every row in the batch). The engine's steps
  wait at their end until the 400s are in, so the long answer is still running then however slow the
  machine (the 400s are refused before the engine)."""
  c = served["client"]
  chunks, errors = [], []
  server = served["server"]
  stepped, refused = server.engine.driver.after_step, threading.Event()

  def held(engine):  # a step that ran the long answer ends once the 400s are in
    if server.engine.active_rows():
      refused.wait(60)
    stepped(engine)
  monkeypatch.setattr(server.engine.driver, "after_step", held)

  def long_stream():
    try:
      chunks.extend(c.chat.completions.create(
          model="tiny", messages=MSG, max_tokens=200, temperature=0, stream=True,
          stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    except Exception as e:  # noqa: BLE001 - reported by the assertion below
      errors.append(e)
  thread = threading.Thread(target=long_stream)
  thread.start()
  deadline = time.time() + 60
  while time.time() < deadline and served["server"].engine.active_rows() == 0:
    time.sleep(0.01)
  try:
    for stop in ([""], "", ["ok", ""]):
      with pytest.raises(openai.BadRequestError, match="stop string must not be empty"):
        c.chat.completions.create(model="tiny", messages=MSG, max_tokens=5, stop=stop)
    assert served["server"].engine.active_rows() == 1  # the long answer was still running
  finally:
    refused.set()
  thread.join(120)
  assert not errors
  assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["length"]
  assert chunks[-1].usage.completion_tokens == 200


def test_server_failures_are_server_errors(served, monkeypatch):
  def disk_full(rows):
    raise OSError("disk full")
  monkeypatch.setattr(served["server"].log, "add_responses", disk_full)
  with pytest.raises(openai.InternalServerError) as err:
    served["client"].chat.completions.create(model="tiny", messages=MSG, max_tokens=2)
  assert err.value.status_code == 500
  assert err.value.body["type"] == "server_error" and "disk full" in err.value.body["message"]


def test_big_prompts_are_capped_before_tokenising_and_do_not_stall_the_server(served, monkeypatch):
  url, server = served["url"], served["server"]
  big = {"model": "tiny", "messages": [{"role": "user", "content": "hello world " * 85_000}]}  # ~1 MB
  status, body = http(url, "/v1/chat/completions", big)
  assert status == 400 and "max_prompt_chars" in body["error"]["message"]
  # Without the cap the prompts are tokenised (~1 s each) on worker threads: /health keeps answering.
  monkeypatch.setattr(server, "max_prompt_chars", 10**9, raising=False)
  statuses, latencies = [], []
  senders = [threading.Thread(target=lambda: statuses.extend(http(url, "/v1/chat/completions", big)[0]
                                                           for _ in range(2))) for _ in range(2)]
  for t in senders:
    t.start()
  while any(t.is_alive() for t in senders):
    start = time.perf_counter()
    assert http(url, "/health")[0] == 200
    latencies.append(time.perf_counter() - start)
    time.sleep(0.02)
  assert statuses == [400] * 4  # too long for the context
  # generous: a tokenisation on the event loop holds /health for ~1 s (before: median 0.7-2 s)
  assert len(latencies) >= 3 and statistics.median(latencies) < 0.3, latencies


def test_silent_and_half_sent_connections_are_closed(served):
  """--idle-timeout 2: a connection that sends nothing, half its headers or half its body is closed."""
  port = int(served["url"].rsplit(":", 1)[1])
  auth = f"Authorization: Bearer {KEY}\r\n".encode()
  sent = [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",
          b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: 50\r\n\r\n{\"mo"]
  socks = [socket.create_connection(("127.0.0.1", port), timeout=15) for _ in sent]
  try:
    start = time.perf_counter()
    for s, data in zip(socks, sent):
      s.sendall(data)
    for s in socks:
      assert s.recv(1024) == b""  # EOF: closed by the server (before: never; recv timed out)
    assert time.perf_counter() - start < 10
  finally:
    for s in socks:
      s.close()


def test_client_disconnect_mid_stream_frees_its_slot(served):
  c, engine = served["client"], served["server"].engine
  cancelled = engine.stats["cancelled_rows"]
  stream = c.chat.completions.create(model="beta", messages=MSG, max_tokens=90, temperature=0, stream=True)
  first = [next(iter(stream)) for _ in range(2)]
  assert first[0].choices[0].delta.role == "assistant"
  stream.close()
  deadline = time.time() + 30
  while time.time() < deadline and (engine.active_rows() or engine.stats["cancelled_rows"] == cancelled):
    time.sleep(0.05)
  assert engine.active_rows() == 0 and engine.stats["cancelled_rows"] == cancelled + 1
  r = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=3)
  assert r.usage.completion_tokens >= 1


def test_auto_routes_feedback_reaches_the_stats(served):
  c, url = served["client"], served["url"]
  seen = set()
  for _ in range(3):  # UCB1 tries every variant without rewards first
    r = c.chat.completions.create(model="auto", messages=MSG, max_tokens=2)
    seen.add(r.model)
    assert http(url, "/feedback", {"id": r.id, "reward": 0.5, "comment": "ok"})[0] == 200
  assert seen <= {"tiny", "alpha", "beta"} and len(seen) >= 2
  status, stats = http(url, "/rl/stats")
  assert status == 200
  for v in seen:
    assert stats["variants"][v]["feedback"] >= 1 and stats["router"]["variants"][v]["n"] >= 1


def test_stop_strings_cut_the_answer_before_them_streaming_or_not(served):
  c = served["client"]
  full = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=20, temperature=0,
                                   extra_body={"ignore_eos": True}).choices[0].message.content
  stop = full[len(full) // 2:len(full) // 2 + 3]
  want = full[:full.find(stop)]
  r = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=20, temperature=0, stop=[stop, "@@@"],
                                extra_body={"ignore_eos": True})
  assert (r.choices[0].message.content, r.choices[0].finish_reason) == (want, "stop")
  chunks = list(c.chat.completions.create(model="tiny", messages=MSG, max_tokens=20, temperature=0,
                                          stop=stop, stream=True, extra_body={"ignore_eos": True}))
  assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want
  assert chunks[-1].choices[0].finish_reason == "stop"


def test_health_counts_the_processs_xla_compiles(served):
  status, before = http(served["url"], "/health")
  assert status == 200 and before["compiles"] > 0 and before["compile_s"] > 0  # the engine's programs so far
  jax.jit(lambda x: x * 3 + 1)(np.arange(7.0, dtype=np.float32))  # one new program in the server's process (idle server)
  after = http(served["url"], "/health")[1]
  assert after["compiles"] == before["compiles"] + 1 and after["compile_s"] >= before["compile_s"]


def test_logprob_bytes_rebuild_each_answer_and_flags_of_another_type_are_400(served):
  """Joining a choice's logprobs bytes gives its text, characters split over tokens included (before: each
  such token reported U+FFFD's bytes); "logprobs": "yes" is a 400, not true."""
  url = served["url"]
  body = {"model": "tiny", "messages": MSG, "max_tokens": 40, "temperature": 1.0, "n": 4, "seed": 3,
          "logprobs": True, "ignore_eos": True}
  status, got = http(url, "/v1/chat/completions", body)
  assert status == 200
  partial = 0
  for choice in got["choices"]:
    pieces = [bytes(e["bytes"]) for e in choice["logprobs"]["content"]]
    assert len(pieces) == 40
    assert b"".join(pieces).decode("utf-8", errors="replace") == choice["message"]["content"]
    for p in pieces:
      try:
        p.decode("utf-8")
      except UnicodeDecodeError:
        partial += 1
  assert partial > 0  # some tokens hold part of a character
  for flag in ("logprobs", "stream", "ignore_eos"):
    status, err = http(url, "/v1/chat/completions", {**body, "n": 1, flag: "yes"})
    assert status == 400 and err["error"]["param"] == flag and "'yes'" in err["error"]["message"]


def test_health_splits_the_decode_chunks_time(served):
  """/health's decode_dispatch_s / decode_wait_s / decode_gap_s / decode_gaps count one request's chunks: the
  call, the wait for its results, and the host time before each chunk but the first."""
  url = served["url"]
  before = http(url, "/health")[1]
  body = {"model": "tiny", "messages": MSG, "max_tokens": 20, "temperature": 0, "ignore_eos": True}
  assert http(url, "/v1/chat/completions", body)[0] == 200
  after = http(url, "/health")[1]
  delta = {k: after[k] - before[k] for k in ("decode_calls", "decode_gaps", "decode_dispatch_s", "decode_wait_s",
                                             "decode_gap_s")}
  assert delta["decode_calls"] == 5  # 20 tokens in chunks of 4 (`testing.serve.server_argv`)
  assert delta["decode_gaps"] == 4 and delta["decode_gap_s"] > 0
  assert delta["decode_dispatch_s"] + delta["decode_wait_s"] > 0
  assert {"fineflax-engine", "fineflax-emit", "MainThread"} <= set(after["threads"])  # per-thread CPU: their ids
