"""A burst's path to the engine (issue 30): a short chat request is parsed, templated and tokenised on the
event loop (no worker-thread hop before `engine.submit`; a long one still goes to worker threads), and
`encode_plain`'s Rust-backend fast path gives the ids of the tokenizer's own call."""
import json

import pytest
from starlette.testclient import TestClient

from fineflax.models import load_tokenizer
from fineflax.sampling.chat import chat_prompt_ids, encode_plain, format_chat
from fineflax.serve import app as A

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def tokenizer():
  return load_tokenizer("smollm2-135m-instruct")


TEXTS = ["<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n", "  leading and trailing  ",
         "Ünïcödé, 中文, emoji 🤖🎨 and tabs\tand\nnew lines", "", "<|endoftext|> special in text"]


def test_encode_plain_equals_the_tokenizers_call(tokenizer):
  for text in TEXTS:
    assert encode_plain(tokenizer, text) == tokenizer(text, add_special_tokens=False)["input_ids"], text
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXTS[2]}]
  assert chat_prompt_ids(tokenizer, messages) == tokenizer(format_chat(tokenizer, messages),
                                                           add_special_tokens=False)["input_ids"]


def test_encode_plain_leaves_a_truncating_backend_to_the_wrapper(tokenizer):
  import copy
  tok = copy.deepcopy(tokenizer)
  tok._tokenizer.enable_truncation(3)  # the backend alone would cut every text to 3 tokens
  long = TEXTS[2]
  assert len(tok._tokenizer.encode(long, add_special_tokens=False).ids) == 3
  assert encode_plain(tok, long) == tok(long, add_special_tokens=False)["input_ids"]
  assert len(encode_plain(tok, long)) > 3


def test_encode_plain_lets_other_threads_run_while_it_tokenises(tokenizer):
  """A long prompt is tokenised without holding the GIL (the backend's `encode` holds it for the whole
  call: ~0.5 s for this text with 0-1 ticks of the other thread, which stalled a server's /health)."""
  import threading
  import time
  text = "hello world " * 85_000
  ticks, done = [], threading.Event()

  def ticker():
    while not done.is_set():
      start = time.perf_counter()
      time.sleep(0.002)
      ticks.append(time.perf_counter() - start)

  thread = threading.Thread(target=ticker)
  thread.start()
  time.sleep(0.05)
  before = len(ticks)
  start = time.perf_counter()
  encode_plain(tokenizer, text)
  seconds = time.perf_counter() - start
  during = len(ticks) - before
  done.set()
  thread.join()
  assert during >= 5 and max(ticks) < 0.5 * seconds, (during, max(ticks), seconds)


class _Engine:
  """Stands in for serve.engine.Engine: records how many worker-thread hops ran before each submit and
  answers every job at once."""

  def __init__(self, tokenizer, hops):
    self.tokenizer, self.context, self.adapter_ids, self.stats = tokenizer, 4096, {}, {}
    self.hops, self.submitted = hops, []

  def submit(self, job):
    self.submitted.append((len(self.hops), job.prompt))
    for i in range(job.n):
      job.emit(("delta", i, "ok", []))
      job.emit(("done", i, "stop", 1))


class _Log:
  def add_responses(self, rows):
    pass


def test_a_short_request_reaches_the_engine_without_a_worker_thread_hop(tokenizer, monkeypatch):
  hops = []
  real = A.run_in_threadpool

  async def counted(fn, *args, **kwargs):
    hops.append(getattr(fn, "__name__", fn))
    return await real(fn, *args, **kwargs)
  monkeypatch.setattr(A, "run_in_threadpool", counted)
  engine = _Engine(tokenizer, hops)
  server = A.Server(engine, base_name="tiny", log=_Log(), router=None)
  client = TestClient(A.create_app(server))
  short = [{"role": "user", "content": "What is 2 + 3?"}]
  long = [{"role": "user", "content": "word " * (getattr(A, "INLINE_CHARS", 8192) // 5 + 10)}]  # over INLINE_CHARS
  for messages in (short, long):
    r = client.post("/v1/chat/completions", content=json.dumps({"model": "tiny", "messages": messages,
                                                                "max_tokens": 4}))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok", r.text
  (short_hops, short_ids), (long_hops, long_ids) = engine.submitted
  assert short_hops == 0, hops  # before: 3 hops (JSON, validation, template + tokens) per request
  assert short_ids == chat_prompt_ids(tokenizer, short)
  # (the answer's log write is no hop either: serve.logwriter's thread)
  assert hops[short_hops:long_hops] == ["parse_json", "parse_chat_request", "prompt_ids"], hops
  assert long_ids == chat_prompt_ids(tokenizer, long)


class _Steps:
  """An engine whose step 'decodes' the items admitted so far (for at most 100 steps); records each step's
  row count."""

  def __init__(self):
    self.admitted, self.rows = [], []

  def step(self):
    if not self.admitted or len(self.rows) >= 100:
      return False
    self.rows.append(len(self.admitted))
    return True


@pytest.mark.parametrize("gather_s", [0.0, 2.0])
def test_a_burst_reaching_an_idle_engine_starts_in_one_step(gather_s):
  import threading
  import time
  from fineflax.engine.driver import EngineThread
  engine = _Steps()
  kwargs = {"gather_s": gather_s, "quiet_s": 0.1} if gather_s else {}
  driver = EngineThread(lambda: engine, **kwargs).start()
  try:
    time.sleep(0.1)  # idle
    for i in range(8):  # a burst: 8 requests 10 ms apart
      driver.call(lambda e, i=i: e.admitted.append(i))
      time.sleep(0.01)
    deadline = time.time() + 10
    while (not engine.rows or engine.rows[-1] < 8) and time.time() < deadline:
      time.sleep(0.01)
  finally:
    driver.stop()
  if gather_s:
    assert engine.rows[0] == 8, engine.rows  # every request of the burst in the first step
  else:
    assert engine.rows[0] < 8, engine.rows  # without gathering the first arrival starts alone
