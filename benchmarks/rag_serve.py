"""Latency target of issue 34: the naive RAG variant's p50 request latency at 16 concurrent clients against the
bare model's at the same answer length (retrieval must not serialise requests).

  python -m benchmarks.rag_serve --out DIR                      # GPU: SmolLM2-135M-Instruct, 16 clients
  python -m benchmarks.rag_serve --tiny --out DIR               # CPU check: tiny random model, 4 clients

One server (`python -m fineflax.serve` in a subprocess, slots = clients) with a RAG config: the
rag_loop knowledge base (`fineflax/rag/kb.py`, 406 passages) behind a --retriever index ("vector":
all-MiniLM-L6-v2 + FAISS flat, the default; or "bm25"), and `naive_rag` (k = 3, the base model generates).
Clients: `openai.AsyncOpenAI`; each of N clients sends --rounds non-streaming requests one after another
(closed loop), greedy, `ignore_eos` and max_tokens = --new-tokens so every answer has the same length; the
question is a KB question (the bare model gets the same question without passages). Per model (bare
"bench", then "naive_rag") one untimed level with the timed level's schedule (clients x rounds, other
questions), then the timed level: latency = send -> full response; p50 over the level's requests. The server
starts with `--warmup` (every program compiled before serving); "compiles in timed level" = its XLA compiles
during the timed level (`/health` before and after). Target: p50(naive_rag) / p50(bare) <= 1.5 at 16 clients.
Writes DIR/rag_serve.json and DIR/rag_serve.md (--results: benchmarks/RESULTS.md's section too).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import sys
import time

from benchmarks import gpu
from benchmarks._results import markdown_table, publish
from fineflax.io import atomic_write_text
from fineflax.serve.spawn import health, spawn_server
from fineflax.testing.serve import free_port


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="benchmarks/out/rag_serve")
  ap.add_argument("--model", default="smollm2-135m-instruct")
  ap.add_argument("--tiny", action="store_true", help="CPU check: tiny random model, 4 clients, 8 tokens")
  ap.add_argument("--clients", type=int, default=None, help="concurrent clients (default 16; tiny 4)")
  ap.add_argument("--new-tokens", type=int, default=None, help="tokens per answer (default 64; tiny 8)")
  ap.add_argument("--rounds", type=int, default=None, help="timed requests per client (default 4; tiny 2)")
  ap.add_argument("--retriever", default="vector", choices=("vector", "bm25"))
  ap.add_argument("--quant", default="none", choices=("nf4", "int8", "none"))
  ap.add_argument("--dtype", default=None, choices=("bfloat16", "float32"))
  ap.add_argument("--context", type=int, default=512)
  ap.add_argument("--results", action="store_true", help="write the rag-serve section of benchmarks/RESULTS.md")
  args = ap.parse_args(argv)
  defaults = dict(clients=4, new_tokens=8, rounds=2, dtype="float32") if args.tiny else dict(
      clients=16, new_tokens=64, rounds=4, dtype="bfloat16")
  for k, v in defaults.items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  return args


async def _level(url, model, questions, clients, rounds, new_tokens):
  import httpx2
  import openai
  limits = httpx2.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
  client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=3600,
                              http_client=httpx2.AsyncClient(limits=limits, timeout=3600))
  latencies = []

  async def one(i):
    for r in range(rounds):
      q = questions[(i * rounds + r) % len(questions)]
      t0 = time.perf_counter()
      out = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": q}],
                                                 max_tokens=new_tokens, temperature=0.0,
                                                 extra_body={"ignore_eos": True})
      latencies.append(time.perf_counter() - t0)
      assert out.usage.completion_tokens == new_tokens, out.usage
  t0 = time.perf_counter()
  await asyncio.gather(*[one(i) for i in range(clients)])
  wall = time.perf_counter() - t0
  await client.close()
  return {"requests": len(latencies), "wall_s": wall, "p50_s": statistics.median(latencies),
          "p90_s": statistics.quantiles(latencies, n=10)[-1] if len(latencies) > 1 else latencies[0]}


def main(argv=None):
  args = parse_args(argv)
  out = pathlib.Path(args.out).resolve()
  out.mkdir(parents=True, exist_ok=True)
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(out / "jax_cache"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")  # the server inherits both
  if args.tiny:
    from fineflax.testing.serve import tiny_chat_model
    args.model = tiny_chat_model(out)
  from fineflax.rag.kb import make_kb
  docs, questions = make_kb()
  atomic_write_text(out / "corpus.jsonl", "".join(json.dumps(d) + "\n" for d in docs))
  atomic_write_text(out / "rag.json", json.dumps({
      "retrievers": {"kb": {"kind": args.retriever, "corpus": "corpus.jsonl"}},
      "variants": {"naive_rag": {"retriever": "kb", "k": 3}}}))
  port = free_port()
  log = out / "serve_log.sqlite"
  for p in out.glob("serve_log.sqlite*"):
    p.unlink()
  argv_server = ["--model", args.model, "--name", "bench", "--quant", args.quant, "--dtype", args.dtype,
                 "--slots", str(args.clients), "--context", str(args.context), "--chunk", "8",
                 "--max-tokens-limit", str(args.new_tokens), "--log", str(log), "--log-sync", "NORMAL",
                 "--rag-config", str(out / "rag.json"), "--port", str(port), "--warmup"]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(gpu.REPO), os.environ.get("PYTHONPATH", "")]))
  t0 = time.perf_counter()
  proc, url = spawn_server(argv_server, env=env, log_path=out / "server.log", timeout=1800, poll_s=0.5)
  qs = [q["question"] for q in questions]
  rows = {}
  try:
    for model in ("bench", "naive_rag"):
      asyncio.run(_level(url, model, qs[::-1], args.clients, args.rounds, args.new_tokens))  # untimed, same schedule
      before = health(url)
      rows[model] = asyncio.run(_level(url, model, qs, args.clients, args.rounds, args.new_tokens))
      rows[model]["compiles"] = health(url)["compiles"] - before["compiles"]
      print(f"{model}: {rows[model]}", flush=True)
  finally:
    proc.terminate()
    proc.wait(timeout=60)
  ratio = rows["naive_rag"]["p50_s"] / rows["bench"]["p50_s"]
  device = gpu.device_name()
  command = "python -m benchmarks.rag_serve " + " ".join(sys.argv[1:] if argv is None else argv)
  table = markdown_table(["model", "requests", "p50 latency s", "p90 latency s", "wall s", "compiles in timed level"],
                         [[m, r["requests"], r["p50_s"], r["p90_s"], r["wall_s"], r["compiles"]]
                          for m, r in rows.items()])
  md = (f"Device: {device}. Command: `{command}` ({time.perf_counter() - t0:.0f} s).\n"
        f"Model {args.model}, {args.dtype}, quant {args.quant}; {args.clients} concurrent clients x {args.rounds} "
        f"non-streaming requests, {args.new_tokens} new tokens (ignore_eos, greedy); naive_rag = {args.retriever} "
        f"retrieval (k = 3) over the rag_loop KB, then the base model. p50(naive_rag) / p50(bare) = "
        f"**{ratio:.2f}** (target <= 1.5 at 16 clients).\n\n{table}\n")
  publish(out, "rag_serve", {"device": device, "args": vars(args), "rows": rows, "ratio": ratio}, md,
          ("rag-serve", "## RAG variant latency (issue 34): naive RAG vs the bare model") if args.results else None)


if __name__ == "__main__":
  main()
