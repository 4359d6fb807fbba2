"""A chat request's answer from its job's events: one JSON response (`_complete`) or server-sent events
(`_stream`), and the logged rows (`_log`); `serve.app.Server` inherits them (it holds `engine`, `log` and
`token_bytes`, `log_writer`). See `serve.app`'s docstring for disconnects and the waiting queue's 429 / 503."""
from __future__ import annotations

import asyncio
import json

from starlette.responses import JSONResponse, Response, StreamingResponse

from fineflax.serve import protocol as P
from fineflax.serve.events import event_error, post_on_disconnect


class Answers:
  """The answer methods of `serve.app.Server` (module docstring)."""

  async def _respond(self, request, job, queue, ctx):
    """A stream starts (status 200) with the job's first event, once a row of it is admitted: a request
    refused while it waits (the queue's deadline) still gets its 503, and a client gone before is a 499."""
    if ctx["req"].stream:
      first = await self._next_event(request, job, queue)
      if first[0] == "disconnect":
        return Response(status_code=499)
      if first[0] == "error":
        raise event_error(first)
      return StreamingResponse(self._stream(job, queue, ctx, first), media_type="text/event-stream",
                               headers={"x-fineflax-variant": ctx["variant"]})
    return await self._complete(request, job, queue, ctx)

  async def _next_event(self, request, job, queue):
    """The job's next event, or ("disconnect",) when the client leaves first (its job is then cancelled)."""
    watcher = asyncio.create_task(post_on_disconnect(request, queue))
    try:
      ev = await queue.get()
    finally:
      watcher.cancel()
    if ev[0] == "disconnect":
      self.engine.cancel(job)
    return ev

  async def _complete(self, request, job, queue, ctx):
    """The whole answer as one JSON response. A client that disconnects before it is ready cancels the job
    at once (`post_on_disconnect` puts a ("disconnect",) event on the job's queue, so it is seen between two
    chunk events, not after a timeout that events keep resetting): its rows leave at the engine's next
    step, and the undelivered answer is not logged (status 499, as nginx logs it)."""
    texts, entries, reasons, counts = [""] * job.n, [[] for _ in range(job.n)], [None] * job.n, [0] * job.n
    watcher = asyncio.create_task(post_on_disconnect(request, queue))
    try:
      while None in reasons:
        ev = await queue.get()
        if ev[0] == "disconnect":
          self.engine.cancel(job)
          return Response(status_code=499)
        if ev[0] == "error":
          raise event_error(ev)
        if ev[0] == "delta":
          texts[ev[1]] += ev[2]
          entries[ev[1]] += ev[3]
        else:
          reasons[ev[1]], counts[ev[1]] = ev[2], ev[3]
    finally:
      watcher.cancel()
    await self._log(ctx, texts, reasons, counts)
    lp = lambda i: {"content": P.logprob_content(entries[i], self.token_bytes)} if ctx["req"].logprobs else None
    choices = [{"index": i, "message": {"role": "assistant", "content": texts[i]},
                "finish_reason": reasons[i], "logprobs": lp(i)}
               for i in range(job.n)]
    return JSONResponse(P.completion(ctx["rid"], ctx["variant"], ctx["created"], choices,
                                     P.usage(ctx["prompt_len"], sum(counts))),
                        headers={"x-fineflax-variant": ctx["variant"]})

  async def _stream(self, job, queue, ctx, first):
    """The SSE stream of a job: a role chunk per choice, then its events as chunks. The events already queued
    go out in one write (the role chunks with the first delta; a last delta with its finish, the usage and
    [DONE]): each write costs the event loop a pass through the ASGI stack, and the loop bounds a busy server."""
    rid, variant, created, req = ctx["rid"], ctx["variant"], ctx["created"], ctx["req"]
    sse = lambda obj: f"data: {json.dumps(obj)}\n\n"
    texts, reasons, counts = [""] * job.n, [None] * job.n, [0] * job.n
    out = [sse(P.chunk(rid, variant, created, [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                "finish_reason": None, "logprobs": None}])) for i in range(job.n)]
    try:
      ev = first
      while True:
        if ev[0] == "disconnect":  # (the client left as the stream started: the finally clause cancels)
          return
        if ev[0] == "error":
          out.append(sse({"error": {"message": ev[1], "type": "server_error", "param": None, "code": None}}))
          yield "".join(out)
          return
        if ev[0] == "delta" and (ev[2] or req.logprobs):  # else tokens held back (a possible stop string
          texts[ev[1]] += ev[2]                            # or a partial character): nothing to send
          lp = {"content": P.logprob_content(ev[3], self.token_bytes)} if req.logprobs else None
          out.append(sse(P.chunk(rid, variant, created, [{"index": ev[1], "delta": {"content": ev[2]},
                                                          "finish_reason": None, "logprobs": lp}])))
        elif ev[0] == "done":
          reasons[ev[1]], counts[ev[1]] = ev[2], ev[3]
          out.append(sse(P.chunk(rid, variant, created, [{"index": ev[1], "delta": {}, "finish_reason": ev[2],
                                                          "logprobs": None}])))
        if None not in reasons:
          break
        if queue.empty():  # nothing more now: send what is ready, then wait
          if out:
            yield "".join(out)
            out = []
          ev = await queue.get()
        else:
          ev = queue.get_nowait()
      await self._log(ctx, texts, reasons, counts)
      if req.include_usage:
        out.append(sse(P.chunk(rid, variant, created, [], P.usage(ctx["prompt_len"], sum(counts)))))
      yield "".join(out) + "data: [DONE]\n\n"
    finally:
      if None in reasons:
        self.engine.cancel(job)

  async def _log(self, ctx, texts, reasons, counts):
    rows = [{"id": ctx["rid"] if i == 0 else f"{ctx['rid']}/{i}", "created": ctx["created"],
             "variant": ctx["variant"], "request": ctx["body"], "messages": ctx["req"].messages,
             "answer": texts[i], "settings": ctx["settings"], "choice": i, "prompt_tokens": ctx["prompt_len"],
             "completion_tokens": counts[i], "finish_reason": reasons[i], **ctx["record"]}
            for i in range(len(texts))]
    await self.log_writer.add(rows)  # one transaction for the answers that end together
