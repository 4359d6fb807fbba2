"""The HTTP API (Starlette): OpenAI chat completions, models, feedback and reward statistics.

  POST /v1/chat/completions   OpenAI chat completions (stream = server-sent chat.completion.chunk events,
                              then `data: [DONE]`); model = the base name, an adapter name, a RAG variant
                              or "auto" (the bandit router picks, per category when the request has one;
                              the response's `model` names the variant)
  GET  /v1/models             the base, the adapters, the RAG variants and "auto"
  POST /feedback              {"id", "reward", "comment"?} -> {"feedback_id", "variant"}; unknown id: 404;
                              reward not a finite number in the log's range (--reward-min/max): 400
  GET  /rl/stats              per-variant responses, feedback count, mean reward, 95% CI (overall and per
                              category); router state
  GET  /rl/leaderboard        per category (and "all"): variants ranked by mean reward, with count and CI
  GET  /metrics               Prometheus text: KV pages, rows, evictions, cancellations, rejections, queue wait
                              (`serve.metrics`; /health holds the same fields)
  GET  /health                {"status": "ok", "active_rows", "waiting", "prefill_tokens", "prefix_hit_tokens",
                               "decode_calls", "decode_rows", "compiles", "compile_s"} (since the start: prompt
                              tokens prefilled / taken from the prefix cache, decode chunks and the rows they
                              decoded; XLA backend compiles of the process and their seconds; the decode
                              chunks' call / wait / host-gap seconds; "threads": {thread name: native id} and
                              "processes": {prefix: pid}, for per-thread CPU from /proc/PID/task/ID/stat; a
                              thread "p:name" runs in processes[p]: with --api-procs, "engine:" and "api0:"...)

RAG variants (`fineflax.rag`, `fineflax.serve.rag`): naive / hybrid RAG retrieve on a worker thread, then
their generator (base or adapter) answers the context messages through the same engine path (streaming,
n, log-probs); an agentic variant runs the Search-R1 loop on a worker thread (n = 1; a stream sends its
answer as one delta). Each logged response holds its question, category, passages and input messages.

Every error is a JSON {"error": {...}} with a 4xx status (5xx only for engine failures); the server keeps
serving, and a request's bad parameter only ever fails that request. With an API key, every route but
/health needs `Authorization: Bearer <key>` (else 401). Request bodies over `max_body_bytes` get 413;
messages of more than `max_prompt_chars` characters get 400 before tokenising (default: the context times
the longest token's length in characters, a prompt that cannot fit). JSON parsing, validation, the chat
template and tokenising of a large request run on worker threads, not on the event loop (a 1 MB prompt takes
~1.4 s to tokenise on one core); a short one's (bodies and messages of at most `INLINE_CHARS`) run on the event
loop: they take ~0.5 ms, less than one worker-thread hop under a burst (~1.8 ms at 128 requests on this
project's CPU), and each request of a burst then reaches the engine on its own instead of every request
waiting for the whole burst to pass each stage. A client that disconnects (streaming or not) cancels its rows
at the next event; an answer it did not get is not logged. Backpressure: `engine.submit` raises QueueFull
past the waiting queue's bound (429 + Retry-After); a job past the queue's deadline ends with a 503 event
(+ Retry-After), which a stream still answers as a 503 (it starts with its first event).
`uvicorn_config` closes connections that keep silent (see `retrieval.asgi.idle_timeout_protocol`).
"""
from __future__ import annotations

import asyncio
import hmac
import uuid

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from retrieval.asgi import idle_timeout_protocol, parse_json, read_capped_body

from fineflax.engine.detok import token_bytes
from fineflax.rag.agents import context_messages, question_of, retrieve, run_agentic
from fineflax.rag.retrievers import passage_record
from fineflax.sampling.chat import chat_prompt_ids
from fineflax.serve import protocol as P
from fineflax.serve.engine import Job
from fineflax.serve.answers import Answers
from fineflax.serve.events import LoopOutbox
from fineflax.serve.feedback import UnknownResponse
from fineflax.serve.logwriter import LogWriter
from fineflax.serve.metrics import health_fields, prometheus
from fineflax.serve.waiting import QueueFull


INLINE_CHARS = 8192  # request bodies (bytes) and messages (characters) up to this size are handled on the loop


async def off_loop(size: int, fn, *args, **kwargs):
  """fn(*args, **kwargs) on the event loop when its input is at most `INLINE_CHARS` long (`size`: bytes or
  characters), else on a worker thread (module docstring)."""
  if size <= INLINE_CHARS:
    return fn(*args, **kwargs)
  return await run_in_threadpool(fn, *args, **kwargs)


def message_chars(messages) -> int:
  """Characters of the messages' contents (the size `prompt_ids` checks against max_prompt_chars)."""
  return sum(len(m["content"]) for m in messages)


def longest_token_chars(tokenizer) -> int:
  """The longest token string of the vocabulary: an upper bound on the characters one token decodes to
  (byte-level BPE writes one character per byte; SentencePiece's "▁" stands for one space)."""
  return max(len(t) for t in tokenizer.get_vocab())


class Server(Answers):
  """The app's state: engine, names, log, router and limits (see `create_app`)."""

  def __init__(self, engine, *, base_name, log, router, api_key=None, max_body_bytes=1 << 20,
               max_tokens_limit=1024, max_n=8, max_prompt_chars=None, rag=None):
    self.engine, self.base_name, self.log, self.router = engine, base_name, log, router
    self.api_key, self.max_body_bytes = api_key, int(max_body_bytes)
    self.max_tokens_limit, self.max_n = int(max_tokens_limit), int(max_n)
    self.max_prompt_chars = int(max_prompt_chars or engine.context * longest_token_chars(engine.tokenizer))
    self.variants = {base_name: None, **{name: name for name in engine.adapter_ids}}  # name -> adapter
    self.rag = rag  # fineflax.serve.rag.RagRuntime or None
    self.token_bytes = token_bytes(engine.tokenizer)  # token id -> its bytes (logprobs)
    self.log_writer = LogWriter(log)  # group commit of the answers' log rows
    self._outbox: LoopOutbox | None = None  # of the running event loop
    for name, v in (rag.variants.items() if rag else ()):
      generator = v.generator or base_name
      if name in self.variants or name == "auto":
        raise ValueError(f"RAG variant {name}: the name is taken by a served model")
      if generator not in self.variants:
        raise ValueError(f"RAG variant {name}: generator={generator!r} is not served (served: "
                         f"{sorted(self.variants)})")
    self.variants.update({name: self.variants[v.generator or base_name] for name, v in
                          (rag.variants.items() if rag else ())})

  # -- helpers -----------------------------------------------------------------------------------
  def check_auth(self, request: Request):
    if self.api_key is None:
      return
    got = request.headers.get("authorization", "")
    if not hmac.compare_digest(got.encode(), f"Bearer {self.api_key}".encode()):
      raise P.ApiError(401, "missing or wrong API key (Authorization: Bearer <key>)", code="invalid_api_key")

  async def read_json(self, request: Request):
    return (await self.read_json_sized(request))[0]

  async def read_json_sized(self, request: Request):
    """(the request's JSON body, its size in bytes); 413 over max_body_bytes, 400 for bad JSON."""
    data, total = await read_capped_body(request, self.max_body_bytes)
    if data is None:
      raise P.ApiError(413, f"request body of {total} bytes exceeds the limit of {self.max_body_bytes} bytes")
    try:
      return await off_loop(len(data), parse_json, data), len(data)
    except ValueError as e:
      raise P.ApiError(400, str(e)) from None

  def outbox(self) -> LoopOutbox:
    """The running event loop's `LoopOutbox` (made on first use; a new loop gets a new one)."""
    loop = asyncio.get_running_loop()
    if self._outbox is None or self._outbox.loop is not loop:
      self._outbox = LoopOutbox(loop)
    return self._outbox

  def resolve(self, model: str, category: str | None = None) -> str:
    if model == "auto":
      return self.router.choose(category)
    if model not in self.variants:
      raise P.ApiError(404, f"model {model!r} not found; available: {sorted(self.variants) + ['auto']}",
                       "model", "model_not_found")
    return model

  def prompt_ids(self, messages) -> list[int]:
    """The prompt's token ids (on a worker thread for long messages: `off_loop`); 400 for messages over
    `max_prompt_chars`."""
    chars = message_chars(messages)
    if chars > self.max_prompt_chars:
      raise P.ApiError(400, f"messages hold {chars} characters, more than the {self.max_prompt_chars} a prompt "
                       f"can hold here (max_prompt_chars; the context is {self.engine.context} tokens)", "messages")
    tok = self.engine.tokenizer
    try:
      return chat_prompt_ids(tok, messages)
    except Exception as e:
      raise P.ApiError(400, f"messages could not be rendered with the chat template ({e})", "messages")

  # -- routes ------------------------------------------------------------------------------------
  async def models(self, request: Request):
    self.check_auth(request)
    names = list(self.variants) + ["auto"]
    return JSONResponse({"object": "list", "data": [
        {"id": n, "object": "model", "created": 0, "owned_by": "fineflax"} for n in names]})

  async def chat(self, request: Request):
    self.check_auth(request)
    body, size = await self.read_json_sized(request)
    req = await off_loop(size, P.parse_chat_request, body, max_tokens_limit=self.max_tokens_limit,
                         max_n=self.max_n)
    question = question_of(req.messages)
    category = self.rag.category(req.category, question) if self.rag else req.category
    variant = self.resolve(req.model, category)
    rag = self.rag.variants.get(variant) if self.rag else None
    record = {"category": category}
    messages = req.messages
    if rag is not None:
      if rag.kind == "agentic_rag":
        return await self._agentic(request, req, body, variant, rag, question, record)
      hits = await run_in_threadpool(retrieve, rag, self.rag.retrievers.get(rag.retriever), question)
      messages = context_messages(rag, req.messages, hits)
      record.update(question=question, passages=[passage_record(h) for h in hits], input=messages)
    prompt = await off_loop(message_chars(messages), self.prompt_ids, messages)
    room = self.engine.context - len(prompt)
    max_tokens = req.max_tokens if req.max_tokens is not None else min(self.max_tokens_limit, room)
    if max_tokens > room or room < 1:
      raise P.ApiError(400, f"the prompt has {len(prompt)} tokens; with max_tokens={max_tokens} it exceeds "
                       f"the context of {self.engine.context} tokens", "max_tokens")
    queue, outbox = asyncio.Queue(), self.outbox()
    job = Job(prompt=prompt, emit=lambda ev: outbox.post(queue, ev), n=req.n,
              max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, stop=req.stop,
              seed=req.seed, adapter=self.variants[variant], ignore_eos=req.ignore_eos)
    try:
      self.engine.submit(job)
    except ValueError as e:
      raise P.ApiError(400, str(e)) from None
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", P.now()
    settings = {"temperature": req.temperature, "top_p": req.top_p, "max_tokens": max_tokens,
                "stop": list(req.stop), "seed": req.seed, "n": req.n}
    ctx = dict(rid=rid, created=created, variant=variant, body=body, req=req, settings=settings,
               prompt_len=len(prompt), record=record)
    return await self._respond(request, job, queue, ctx)

  async def _agentic(self, request, req, body, variant, rag, question, record):
    """The Search-R1 loop on a worker thread (module docstring), answered through `_respond`."""
    from fineflax.serve.rag import EngineLLM
    if req.n != 1:
      raise P.ApiError(400, f"n={req.n}: the agentic variant {variant!r} answers with n = 1", "n")
    llm = EngineLLM(self.engine, self.variants[variant], req.temperature, req.seed)
    budget = min(req.max_tokens or self.max_tokens_limit, self.engine.context // 2)
    try:
      out = await run_in_threadpool(run_agentic, rag, self.rag.retrievers[rag.retriever], question, llm,
                                    self.engine.tokenizer, temperature=req.temperature,
                                    max_response_tokens=budget)
    except (ValueError, RuntimeError) as e:
      raise P.ApiError(500, f"agentic variant {variant!r} failed: {e}") from None
    record.update(question=question, passages=out.passages, input=out.input, trace=out.rollout.trace)
    queue, completion = asyncio.Queue(), len(out.rollout.tokens)
    queue.put_nowait(("delta", 0, out.answer, []))
    queue.put_nowait(("done", 0, "stop" if out.rollout.finish == "answer" else "length", completion))
    settings = {"temperature": req.temperature, "top_p": req.top_p, "max_tokens": budget, "stop": [],
                "seed": req.seed, "n": 1}
    ctx = dict(rid=f"chatcmpl-{uuid.uuid4().hex}", created=P.now(), variant=variant, body=body, req=req,
               settings=settings, prompt_len=out.prompt_tokens, record=record)
    return await self._respond(request, Job(prompt=[], emit=None), queue, ctx)

  async def feedback(self, request: Request):
    self.check_auth(request)
    body = await self.read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("id"), str):
      raise P.ApiError(400, 'feedback: expected {"id": <response id>, "reward": <number>, "comment"?}', "id")
    try:
      reward = self.log.check_reward(body.get("reward"))
    except ValueError as e:
      raise P.ApiError(400, f"{e} (the server's --reward-min/--reward-max)", "reward") from None
    comment = body.get("comment")
    if comment is not None and not isinstance(comment, str):
      raise P.ApiError(400, f"comment={comment!r}: expected a string", "comment")
    try:
      fid, variant, category = await run_in_threadpool(self.log.add_feedback_in_context, body["id"], reward,
                                                       comment)
    except UnknownResponse:
      raise P.ApiError(404, f"no response with id {body['id']!r} in the log", "id", "response_not_found")
    self.router.update(variant, reward, category)
    return JSONResponse({"feedback_id": fid, "id": body["id"], "variant": variant})

  async def stats(self, request: Request):
    self.check_auth(request)
    variants = await run_in_threadpool(self.log.stats)
    categories = await run_in_threadpool(self.log.category_stats)
    return JSONResponse({"variants": variants, "categories": categories, "router": self.router.snapshot()})

  async def leaderboard(self, request: Request):
    self.check_auth(request)
    return JSONResponse({"leaderboard": await run_in_threadpool(self.log.leaderboard)})

  async def health(self, request: Request):
    st = await run_in_threadpool(self.engine.state)
    return JSONResponse({"status": "ok", "active_rows": st["active_rows"], "waiting": st["waiting"],
                         "prefill_tokens": st["prefill_tokens"], "prefix_hit_tokens": st["prefix_hit_tokens"],
                         "decode_calls": st["decode_calls"], "decode_rows": st["decode_rows"],
                         "decode_dispatch_s": round(st["dispatch_s"], 6), "decode_wait_s": round(st["wait_s"], 6),
                         "decode_gap_s": round(st["gap_s"], 6), "decode_gaps": st["gaps"],
                         "compiles": st["compiles"], "compile_s": round(st["compile_s"], 3),
                         "front_end_restarts": st.get("front_end_restarts", 0),
                         **health_fields(st["metrics"]), "threads": st["threads"], "processes": st["processes"]})

  async def metrics(self, request: Request):
    self.check_auth(request)
    st = await run_in_threadpool(self.engine.state)
    return Response(prometheus(st["metrics"]), media_type="text/plain; version=0.0.4; charset=utf-8")


def _guard(handler):
  async def wrapped(request):
    try:
      return await handler(request)
    except P.ApiError as e:
      return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
    except QueueFull as e:  # the waiting queue is full: 429, come back in Retry-After seconds
      err = P.ApiError(429, str(e), code="server_overloaded", headers={"Retry-After": str(e.retry_after)})
      return JSONResponse(err.body(), status_code=429, headers=err.headers)
    except Exception as e:  # anything unforeseen is a 500 for this request, not a dead server
      err = P.ApiError(500, f"internal error: {type(e).__name__}: {e}")
      return JSONResponse(err.body(), status_code=500)
  return wrapped


def create_app(server: Server) -> Starlette:
  """The Starlette app; starts the engine thread on startup and stops it on shutdown."""
  import contextlib

  @contextlib.asynccontextmanager
  async def lifespan(app):
    server.engine.start()
    yield
    server.engine.stop()
    server.log_writer.close()

  routes = [Route("/v1/chat/completions", _guard(server.chat), methods=["POST"]),
            Route("/v1/models", _guard(server.models), methods=["GET"]),
            Route("/feedback", _guard(server.feedback), methods=["POST"]),
            Route("/rl/stats", _guard(server.stats), methods=["GET"]),
            Route("/rl/leaderboard", _guard(server.leaderboard), methods=["GET"]),
            Route("/health", _guard(server.health), methods=["GET"]),
            Route("/metrics", _guard(server.metrics), methods=["GET"])]
  app = Starlette(routes=routes, lifespan=lifespan)
  app.state.server = server
  return app


def uvicorn_config(app, host: str, port: int, *, keep_alive_timeout: float = 5.0, idle_timeout: float = 10.0,
                   log_level: str = "warning"):
  """The uvicorn.Config the server runs with: keep-alive connections close after `keep_alive_timeout` s
  idle, and any connection waiting on its client (nothing sent, half the headers or half the body) for
  `idle_timeout` s is closed, so silent connections cannot use up the file descriptors."""
  import uvicorn
  return uvicorn.Config(app, host=host, port=port, http=idle_timeout_protocol(idle_timeout),
                        timeout_keep_alive=keep_alive_timeout, log_level=log_level)
