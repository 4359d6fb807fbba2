"""The closed-loop streaming clients of `benchmarks/serve.py` and `benchmarks/serve_http.py`: one level of N clients
(`_level`), spread over client processes, each sending its requests one after another and timing the first token."""
from __future__ import annotations

import asyncio
import json
import statistics
import time

PROMPT = [{"role": "user", "content": "Tell me a long story about a robot who learns to paint."}]


def shared_messages(system_tokens: int, i: int) -> list[dict]:
  """Request i of the shared case: one system prompt (numbered rules of about 18 SmolLM2 tokens each,
  about `system_tokens` in all) and a question of its own."""
  rules = " ".join(f"Rule {k}: answer briefly, politely and accurately about topic number {k}."
                   for k in range(max(1, system_tokens // 18)))
  return [{"role": "system", "content": "You are a careful assistant. " + rules},
          {"role": "user", "content": f"Question {i}: tell me a story about the number {i}."}]


def _messages(shared, c, r):
  """Messages of client c's round r: PROMPT, or with shared = (system_tokens, offset) the shared case's
  request offset + c."""
  return PROMPT if shared is None else shared_messages(shared[0], shared[1] + c)


async def _raw_client(http, c, rounds, new_tokens, temperature, shared, ttfts, prompt_tokens):
  """`_client` over plain httpx: the server-sent events read as lines, one json.loads each (no pydantic)."""
  tokens = 0
  for r in range(rounds):
    t0, first = time.perf_counter(), None
    body = {"model": "bench", "messages": _messages(shared, c, r), "max_tokens": new_tokens, "stream": True,
            "temperature": temperature, "stream_options": {"include_usage": True}, "ignore_eos": True}
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
      response.raise_for_status()
      async for line in response.aiter_lines():
        if not line.startswith("data: {"):
          continue
        ch = json.loads(line[6:])
        if first is None and ch["choices"] and ch["choices"][0]["delta"].get("content"):
          first = time.perf_counter() - t0
        if ch.get("usage"):
          tokens += ch["usage"]["completion_tokens"]
          prompt_tokens.append(ch["usage"]["prompt_tokens"])
    ttfts.append(first if first is not None else float("nan"))
  return tokens


async def _client(client, c, rounds, new_tokens, temperature, shared, ttfts, prompt_tokens):
  tokens = 0
  for r in range(rounds):
    t0, first = time.perf_counter(), None
    stream = await client.chat.completions.create(
        model="bench", messages=_messages(shared, c, r), max_tokens=new_tokens, temperature=temperature,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for ch in stream:
      if first is None and ch.choices and ch.choices[0].delta.content:
        first = time.perf_counter() - t0
      if ch.usage is not None:
        tokens += ch.usage.completion_tokens
        prompt_tokens.append(ch.usage.prompt_tokens)
    ttfts.append(first if first is not None else float("nan"))
  return tokens


async def _clients(url, lo, hi, rounds, new_tokens, temperature, shared, start_at=None, kind="openai") -> dict:
  """Clients lo..hi-1 of a level in this process (they start at time.time() == start_at, if given): their
  raw counts (TTFTs, tokens, prompt tokens, CPU seconds of this process, first start and last end).
  kind: "openai" (`openai.AsyncOpenAI`) or "httpx" (`_raw_client`)."""
  import httpx2
  import openai
  n = hi - lo
  limits = httpx2.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
  http = httpx2.AsyncClient(limits=limits, timeout=3600, base_url=url)
  client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=3600, http_client=http)
  one = _raw_client if kind == "httpx" else _client
  if start_at is not None:
    await asyncio.sleep(max(0.0, start_at - time.time()))
  ttfts, prompt_tokens = [], []
  t0, cpu0 = time.time(), time.process_time()
  tokens = await asyncio.gather(*[one(http if kind == "httpx" else client, c, rounds, new_tokens, temperature,
                                      shared, ttfts, prompt_tokens) for c in range(lo, hi)])
  t1, cpu = time.time(), time.process_time() - cpu0
  await client.close()
  return {"ttfts": ttfts, "tokens": int(sum(tokens)), "prompt_tokens": int(sum(prompt_tokens)), "cpu_s": cpu,
          "start": t0, "end": t1}


def _client_process(out, *args):
  out.put(asyncio.run(_clients(*args)))


def _level(url, clients, rounds, new_tokens, temperature=1.0, shared=None, procs=1, kind="openai"):
  """One level: `clients` closed-loop streaming clients spread over `procs` client processes (one: this
  process), all starting together. client CPU = the busiest client process's CPU seconds / wall."""
  procs = max(1, min(procs, clients))
  bounds = [clients * i // procs for i in range(procs + 1)]
  if procs == 1:
    parts = [asyncio.run(_clients(url, 0, clients, rounds, new_tokens, temperature, shared, None, kind))]
  else:
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue, start_at = ctx.Queue(), time.time() + 5.0  # children import openai first
    ps = [ctx.Process(target=_client_process, args=(queue, url, bounds[i], bounds[i + 1], rounds, new_tokens,
                                                   temperature, shared, start_at, kind), daemon=True)
          for i in range(procs)]
    for p in ps:
      p.start()
    parts = [queue.get(timeout=3600) for _ in ps]
    for p in ps:
      p.join()
  ttfts = [t for part in parts for t in part["ttfts"]]
  wall = max(p["end"] for p in parts) - min(p["start"] for p in parts)
  tokens = sum(p["tokens"] for p in parts)
  return {"requests": clients * rounds, "tokens": tokens, "wall_s": wall, "req_s": clients * rounds / wall,
          "tok_s": tokens / wall, "ttft_p50_s": statistics.median(ttfts),
          "prompt_tokens": sum(p["prompt_tokens"] for p in parts),
          "client_cpu": max(p["cpu_s"] for p in parts) / wall, "client_procs": procs}
