"""The server's HTTP layer on its own: how many streamed requests one event loop serves when the engine costs nothing.

  python -m benchmarks.serve_http                      # clients 16,64,128; any machine (no device is used)
  python -m benchmarks.serve_http --clients 4 --rounds 2 --tick-ms 5      # quick check
  ... --results                                        # also writes RESULTS.md's serve-http section

The real app (`fineflax.serve.app.Server`: uvicorn, starlette, the chat route, the SSE stream, the answer log, the
router) runs in this process on a `StubEngine`: every `--tick-ms` it gives each admitted job one delta of
`--new-tokens / --deltas` words, and after `--deltas` of them its end, as a decode chunk of the real engine does;
it has no device, no tokenizer work and no slot limit. Clients: `benchmarks.serve`'s closed-loop streaming httpx
clients in `--client-procs` processes, as in `benchmarks/serve.py`. Per level: server req/s and tok/s, the event
loop thread's CPU ms per request (/proc/PID/task/ID/stat over the level), and its busy fraction (CPU / wall).

  front-end ceiling tok/s = new tokens per request / loop CPU s per request

is what one event loop could serve if it did nothing else, whatever the engine: the server's tok/s cannot pass it.
`benchmarks/serve.py` reports the same thread's CPU a decode chunk with the real engine (column "loop").
Writes DIR/serve_http.json and DIR/serve_http.md.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import threading
import time

from benchmarks import gpu
from benchmarks._results import markdown_table, publish
from benchmarks.retrieval_load import cpu_seconds
from benchmarks._serve_clients import _level


class StubEngine:
  """What `fineflax.serve.app.Server` needs of `fineflax.serve.engine.Engine`, without a model: jobs are admitted at
  once and get one delta of `words` words every `tick_s`, then ("done", 0, "length", tokens) after `deltas`."""

  def __init__(self, tokenizer, tick_s: float, deltas: int, words: int, context: int = 512):
    self.tokenizer, self.context, self.adapter_ids, self.stats = tokenizer, context, {}, {}
    self.tick_s, self.deltas, self.text = tick_s, deltas, " word" * words
    self.requests, self._jobs, self._lock, self._running = 0, [], threading.Lock(), False

  def submit(self, job) -> None:
    with self._lock:
      self._jobs.append([job, 0])
      self.requests += 1

  def cancel(self, job) -> None:
    job.cancelled = True

  def active_rows(self) -> int:
    return len(self._jobs)

  def num_waiting(self) -> int:
    return 0

  @staticmethod
  def compile_totals() -> tuple[int, float]:
    return 0, 0.0

  def start(self) -> None:
    self._running = True
    threading.Thread(target=self._run, name="fineflax-engine", daemon=True).start()

  def stop(self) -> None:
    self._running = False

  def _run(self) -> None:
    while self._running:
      time.sleep(self.tick_s)
      with self._lock:
        jobs, self._jobs = self._jobs, []
      for entry in jobs:
        job, sent = entry
        if job.cancelled:
          continue
        job.emit(("delta", 0, self.text, []))
        entry[1] = sent + 1
        if entry[1] == self.deltas:
          job.emit(("done", 0, "length", self.deltas * len(self.text.split())))
        else:
          with self._lock:
            self._jobs.append(entry)


def serve_stub(args, root: pathlib.Path):
  """(base URL, uvicorn server, its thread, the stub engine) of the app on a StubEngine, started."""
  import uvicorn
  from transformers import AutoTokenizer
  from fineflax.serve.app import Server, create_app, uvicorn_config
  from fineflax.serve.feedback import FeedbackLog
  from fineflax.serve.router import ContextualRouter
  from fineflax.testing.serve import free_port, tiny_chat_model
  sys.setswitchinterval(0.0005)  # as `python -m fineflax.serve` does
  tokenizer = AutoTokenizer.from_pretrained(tiny_chat_model(root))  # the bundled SmolLM2 tokenizer
  engine = StubEngine(tokenizer, args.tick_ms / 1e3, args.deltas, args.new_tokens // args.deltas)
  log = FeedbackLog(str(root / "log.sqlite"), synchronous="NORMAL")
  router = ContextualRouter(["bench"], seed=0, contextual=False).load(log.reward_sums(by_category=True))
  server = Server(engine, base_name="bench", log=log, router=router, max_tokens_limit=args.new_tokens)
  port = free_port()
  uv = uvicorn.Server(uvicorn_config(create_app(server), "127.0.0.1", port))
  thread = threading.Thread(target=uv.run, name="loop", daemon=True)
  thread.start()
  while not uv.started:
    if not thread.is_alive():
      raise RuntimeError("the server thread died at start")
    time.sleep(0.02)
  return f"http://127.0.0.1:{port}", uv, thread, engine


def measure(url, thread, engine, clients: int, args) -> dict:
  """One level (after an untimed round): throughput and the event loop thread's CPU per request."""
  procs = args.client_procs or max(1, min(4, clients // 16))
  _level(url, clients, 1, args.new_tokens, procs=procs, kind="httpx")
  cpu0, req0 = cpu_seconds(os.getpid(), thread.native_id), engine.requests
  row = _level(url, clients, args.rounds, args.new_tokens, procs=procs, kind="httpx")
  cpu, requests = cpu_seconds(os.getpid(), thread.native_id) - cpu0, engine.requests - req0
  ms = 1e3 * cpu / max(requests, 1)
  return {"clients": clients, "requests": requests, "req_s": row["req_s"], "tok_s": row["tok_s"],
          "ttft_p50_s": row["ttft_p50_s"], "loop_cpu_ms_req": ms, "loop_busy": cpu / row["wall_s"],
          "front_end_ceiling_tok_s": args.new_tokens / (ms / 1e3) if ms > 0 else float("nan"),
          "client_cpu": row["client_cpu"], "client_procs": procs}


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="benchmarks/out/serve_http", help="folder for serve_http.json and .md")
  ap.add_argument("--clients", default="16,64,128", help="comma-separated concurrency levels")
  ap.add_argument("--rounds", type=int, default=6, help="timed requests per client")
  ap.add_argument("--new-tokens", type=int, default=64, help="tokens (words) per answer")
  ap.add_argument("--deltas", type=int, default=8, help="deltas per answer (decode chunks of new-tokens / deltas)")
  ap.add_argument("--tick-ms", type=float, default=15.0, help="ms between the stub's chunks (the H200 server's "
                  "decode chunk at 128 rows is about 15 ms)")
  ap.add_argument("--client-procs", type=int, default=None, help="client processes (default clients / 16, 1-4)")
  ap.add_argument("--results", action="store_true", help="write the serve-http section of benchmarks/RESULTS.md")
  args = ap.parse_args(argv)
  args.levels = [int(c) for c in args.clients.split(",")]
  if args.new_tokens < args.deltas or args.new_tokens % args.deltas:
    ap.error(f"--new-tokens {args.new_tokens} must be a multiple of --deltas {args.deltas}")
  return args


def main(argv=None):
  args = parse_args(argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  url, uv, thread, engine = serve_stub(args, pathlib.Path(tempfile.mkdtemp(prefix="serve_http_")))
  rows = []
  try:
    for c in args.levels:
      rows.append(measure(url, thread, engine, c, args))
      print(f"clients={c}: {rows[-1]}", flush=True)
  finally:
    uv.should_exit = True
    thread.join(timeout=30)
  command = "python -m benchmarks.serve_http " + " ".join(sys.argv[1:] if argv is None else argv)
  table = markdown_table(["clients", "server req/s", "server tok/s", "p50 TTFT s", "loop CPU ms / request",
                          "loop busy", "front-end ceiling tok/s", "client procs", "client CPU"],
                         [[r["clients"], r["req_s"], r["tok_s"], r["ttft_p50_s"], r["loop_cpu_ms_req"],
                           r["loop_busy"], r["front_end_ceiling_tok_s"], r["client_procs"], r["client_cpu"]]
                          for r in rows])
  md = (f"Machine: {gpu.device_name()} (no device used). Command: `{command}`. Stub engine: a delta of "
        f"{args.new_tokens // args.deltas} words every {args.tick_ms:g} ms, {args.deltas} a request; "
        f"{args.rounds} timed streaming requests per client (httpx).\n\n{table}\n")
  publish(out, "serve_http", {"args": vars(args), "rows": rows}, md,
          ("serve-http", "## The server's HTTP layer on a stub engine (issue 51 (d))") if args.results else None)


if __name__ == "__main__":
  main()
