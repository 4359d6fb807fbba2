"""A traced OpenAI-compatible HTTP front for any `LLM` client (like Agent Lightning's LLM proxy), for agents that
talk HTTP (their own `openai` client, LangChain, an Agent Lightning agent) instead of taking our `llm` object.

  proxy = LLMProxy(llm)                        # serves on 127.0.0.1:<free port>, a daemon thread
  url = proxy.endpoint(tracer)                 # http://127.0.0.1:P/rollout/<key>/v1, bound to this tracer
  POST {url}/chat/completions, {url}/completions   -> llm.chat / llm.complete, recorded as "llm" spans of
                                                       `tracer` (the calls arrive on server threads, so the
                                                       route, not the thread, names the rollout)
Responses follow the OpenAI schema plus vLLM's token-id fields (prompt_token_ids, choices[i].token_ids) and
log-probs, so `OpenAILLM` on the other side gets the ids back too.
"""
from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fineflax.agents.tracing import Tracer, tracing

_ROUTE = re.compile(r"^/rollout/([0-9a-f]+)/v1/(chat/completions|completions)$")


class LLMProxy:
  def __init__(self, llm=None, host: str = "127.0.0.1", port: int = 0):
    self.llm = llm
    self.routes: dict[str, tuple] = {}  # key -> (tracer, llm)
    proxy = self

    class Handler(BaseHTTPRequestHandler):
      def log_message(self, *args):
        pass

      def do_POST(self):
        m = _ROUTE.match(self.path)
        if not m or m.group(1) not in proxy.routes:
          return self._send(404, {"error": {"message": f"unknown route {self.path}"}})
        try:
          body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
          out = proxy.handle(m.group(1), m.group(2), body)
        except Exception as e:  # reported to the client as an OpenAI-style error
          return self._send(400, {"error": {"message": f"{type(e).__name__}: {e}"}})
        self._send(200, out)

      def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    self.server = ThreadingHTTPServer((host, port), Handler)
    self.server.daemon_threads = True
    self.thread = threading.Thread(target=self.server.serve_forever, name="llm-proxy", daemon=True)
    self.thread.start()

  @property
  def base_url(self) -> str:
    host, port = self.server.server_address[:2]
    return f"http://{host}:{port}"

  def endpoint(self, tracer: Tracer | None, llm=None) -> str:
    """A base URL whose calls go to `llm` (default: the proxy's) and are recorded into `tracer` (None: not
    recorded). `release` it when the rollout ends."""
    key = uuid.uuid4().hex
    self.routes[key] = (tracer, llm or self.llm)
    return f"{self.base_url}/rollout/{key}/v1"

  def release(self, endpoint: str) -> None:
    self.routes.pop(endpoint.rstrip("/").split("/")[-2], None)

  def handle(self, key: str, route: str, body: dict) -> dict:
    kw = dict(max_tokens=body.get("max_tokens") or body.get("max_completion_tokens"),
              temperature=body.get("temperature"), stop=body.get("stop"))
    tracer, llm = self.routes[key]
    with tracing(tracer or Tracer()):
      if route == "chat/completions":
        c = llm.chat(body["messages"], **kw)
        lps = [{"token": str(t), "logprob": lp, "bytes": None, "top_logprobs": []}
               for t, lp in zip(c.response_ids, c.logprobs)]
        choice = {"index": 0, "finish_reason": _finish(c.finish_reason), "token_ids": c.response_ids,
                  "message": {"role": "assistant", "content": c.text}, "logprobs": {"content": lps}}
        obj = "chat.completion"
      else:
        c = llm.complete(body["prompt"], **kw)
        choice = {"index": 0, "finish_reason": _finish(c.finish_reason), "text": c.text, "token_ids": c.response_ids,
                  "prompt_token_ids": c.prompt_ids,
                  "logprobs": {"tokens": [str(t) for t in c.response_ids], "token_logprobs": c.logprobs,
                               "top_logprobs": None, "text_offset": None}}
        obj = "text_completion"
    return {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": obj, "created": 0, "model": body.get("model", ""),
            "prompt_token_ids": c.prompt_ids, "choices": [choice],
            "usage": {"prompt_tokens": len(c.prompt_ids), "completion_tokens": len(c.response_ids),
                      "total_tokens": len(c.prompt_ids) + len(c.response_ids)}}

  def close(self):
    self.server.shutdown()
    self.server.server_close()


def _finish(reason: str) -> str:
  return "stop" if reason in ("eos", "stop") else reason
