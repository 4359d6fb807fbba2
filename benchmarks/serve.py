"""Serving target of issue 30: server tokens/s at N concurrent streaming `openai` clients against the engine's
decode-step ceiling, and p50 time to first token at N clients against 1 client.

  python -m benchmarks.serve --model /root/models/SmolLM2-135M-Instruct.Q4_1.gguf --out DIR   # GPU
  python -m benchmarks.serve --tiny --out DIR          # CPU check: tiny random model, 1 and 4 clients
  python -m benchmarks.serve --random-weights --shared-clients 0 --out DIR   # GPU without the GGUF (issue 51)
  ... --results                                        # also writes RESULTS.md's serve-engine section

Server: `python -m fineflax.serve` in a subprocess (slots = the largest client count, --quant as given); with
`--api-procs 0,1,2` one server run per value of its --api-procs (0: one process; K: the engine in one process and K
HTTP front ends in their own, `fineflax.serve.split`), each against the same ceiling.
Clients: `openai.AsyncOpenAI` (or plain httpx: `--client httpx`) in `--client-procs` processes (default one per
`CLIENTS_PER_PROC` clients, at most half the cores; one process of 128 such clients is CPU-bound by itself, and an
`openai` streaming request costs its process ~5 ms of CPU: with 16 clients in a process, the last request of a
burst can leave it up to ~80 ms after the first, a wait its TTFT counts); each of N clients sends `--rounds`
streaming requests one after another (a closed loop), one chat prompt, temperature 1 (`--temperature`),
`ignore_eos` so every answer has exactly `--new-tokens` tokens. Before each timed level two untimed rounds at that
level compile what it needs (the second round's prompts find the first's pages in the prefix cache and prefill
only their last tokens: other prefill shapes).
  server tok/s = completion tokens (from usage) / wall time of the level;
  TTFT = time from sending a request to its first content chunk (p50 over the level's requests);
  client CPU = CPU seconds of the busiest client process / wall: near 1, the clients' own Python bounds the level;
  rows / decode chunk = the server's decode rows / decode chunks over the level (/health): occupancy;
  server CPU ms / request = user + system CPU of the server process over the level / requests.
  server CPU ms a chunk = CPU of the server's engine / emitter / event-loop threads and of the rest of the process
  (XLA's threads, workers) over the level / its decode chunks (/health's thread ids, /proc/PID/task/ID/stat).
Decode ceiling, after the server stopped, in this process: the server's own engine (`fineflax.engine`, same
model, settings and pool) with N sequences of the same prompt admitted and prefilled at once; then their
decode steps are timed (chunks of N rows, host bookkeeping included, no admission, no prefill, no HTTP):
ceiling tok/s = N x new tokens / that time. call / wait / gap ms a chunk (server: over the level, from /health;
ceiling: over its decode) = the engine's time in a decode call, then awaiting its results, and on the host
between one chunk's results and the next call (`fineflax.engine` stats dispatch_s / wait_s / gap_s: a call as
long as the chunk means the call waits for it; a server's gap above the ceiling's is host work or prefill between
its chunks). Targets (issue 30): server / ceiling
>= 0.7 at 128 clients; p50 TTFT at 32 clients <= 2x at 1.
Shared system prompt (`--shared-clients N`, 0 to skip): N clients whose requests share one long system
prompt (about `--system-tokens` tokens) before a question of their own; two untimed rounds, then a timed one,
on the server above (prefix cache on: the untimed rounds have cached the system prompt's pages) and on a
second server started with `--no-prefix-cache`; the server's own counts (`/health`: prompt tokens prefilled
and taken from the prefix cache during the timed round) with and without the cache.
The server starts with `--warmup` (it compiles every program it can meet before serving); "compiles in timed
level" = the server's XLA compiles during the timed level (`/health` before and after; 0 when warm-up covered
every shape). Both processes share a persistent XLA compilation cache (DIR/jax_cache, unless JAX_COMPILATION_CACHE_DIR
is set), so the ceiling's programs, the server's own, are not compiled twice. Writes DIR/serve.json and DIR/serve.md.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time


from benchmarks import gpu
from benchmarks._engine_tables import CHUNK_STATS, chunk_ms, chunk_ms_cell, thread_cpu_ms
from benchmarks._results import markdown_table, write_section
from benchmarks._serve_clients import PROMPT, _level
from benchmarks.retrieval_load import cpu_seconds
from fineflax.io import atomic_write_json, atomic_write_text
from fineflax.serve.spawn import health, spawn_server
from fineflax.testing.serve import free_port

CLIENTS_PER_PROC = 4  # default client processes: one per this many clients (module docstring)


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="benchmarks/out/serve", help="folder for serve.json and serve.md")
  ap.add_argument("--model", default="smollm2-135m-instruct", help="HF folder, .gguf file or alias")
  ap.add_argument("--tiny", action="store_true",
                  help="CPU check: a tiny random Llama with SmolLM2's tokenizer (written under --out), "
                       "float32, no quantisation; default clients 1,4, 16 new tokens, 1 round")
  ap.add_argument("--random-weights", action="store_true",
                  help="random weights of SmolLM2-135M's shape (benchmarks.sampler.SHAPES, N(0, 0.02)) with the "
                       "bundled SmolLM2 tokenizer, written under --out: no checkpoint needed (answers have "
                       "exactly --new-tokens tokens either way: ignore_eos)")
  ap.add_argument("--clients", default=None, help="comma-separated concurrency levels (default 1,32,128)")
  ap.add_argument("--new-tokens", type=int, default=None, help="tokens per answer (default 64)")
  ap.add_argument("--rounds", type=int, default=None, help="timed requests per client (default 2)")
  ap.add_argument("--temperature", type=float, default=1.0, help="of every request and of the ceiling (0: greedy; "
                  "on CPU a tiny model's sampling costs more than its decode, greedy leaves host costs in view)")
  ap.add_argument("--quant", default="none", choices=("nf4", "int8", "none"))
  ap.add_argument("--dtype", default=None, choices=("bfloat16", "float32"), help="default bfloat16")
  ap.add_argument("--chunk", type=int, default=8, help="decode steps per engine call")
  ap.add_argument("--context", type=int, default=512, help="positions per request (prompt + answer)")
  ap.add_argument("--shared-clients", type=int, default=None,
                  help="clients of the shared-system-prompt case (default 32; tiny 4; 0: skip it)")
  ap.add_argument("--system-tokens", type=int, default=None,
                  help="about this many tokens of shared system prompt (default 384; tiny 128)")
  ap.add_argument("--client-procs", type=int, default=None,
                  help=f"client processes a level's clients are spread over (default: one per {CLIENTS_PER_PROC} "
                       "clients, at most half the CPU cores; one process of 128 openai clients is CPU-bound by itself)")
  ap.add_argument("--client", choices=("openai", "httpx"), default="openai", help="openai.AsyncOpenAI, or plain "
                  "httpx streams read as JSON lines (no openai objects per event: less client CPU per request)")
  ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                  help="the server compiles every program before serving (default; --no-warmup: the untimed rounds "
                       "compile what the levels need, quicker on a CPU)")
  ap.add_argument("--api-procs", default="0,1,2",
                  help="comma-separated values of the server's --api-procs, one server run each against the one "
                       "ceiling (0: the front end in the engine's process; K: K front-end processes)")
  ap.add_argument("--results", action="store_true", help="write the serve-engine section of benchmarks/RESULTS.md")
  args = ap.parse_args(argv)
  args.api_procs_list = [int(k) for k in str(args.api_procs).split(",")]
  tiny = dict(clients="1,4", new_tokens=16, rounds=1, dtype="float32", shared_clients=4, system_tokens=128)
  full = dict(clients="1,32,128", new_tokens=64, rounds=2, dtype="bfloat16", shared_clients=32, system_tokens=384)
  for k, v in (tiny if args.tiny else full).items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  if args.tiny and args.random_weights:
    ap.error("--tiny and --random-weights: pick one")
  args.levels = [int(c) for c in args.clients.split(",")]
  args.slots = max(args.levels + [args.shared_clients])
  return args


def client_procs(args, clients: int) -> int:
  """Client processes of a level of `clients` (--client-procs, else one per CLIENTS_PER_PROC clients, at most half
  the cores)."""
  return args.client_procs or max(1, min((os.cpu_count() or 2) // 2, -(-clients // CLIENTS_PER_PROC)))


def server_args(args, port, log):
  return ["--model", args.model, "--name", "bench", "--quant", args.quant, "--dtype", args.dtype,
          "--slots", str(args.slots), "--context", str(args.context), "--chunk", str(args.chunk),
          "--max-tokens-limit", str(args.new_tokens), "--log", str(log), "--log-sync", "NORMAL",
          "--port", str(port), "--warmup" if args.warmup else "--no-warmup"]


def _pids(h: dict, pid: int) -> dict:
  """{prefix: pid} of the server's processes from /health ("processes"; one process: {"": pid})."""
  return h.get("processes") or {"": pid}


def _thread_pid(name: str, pids: dict) -> int:
  """The pid of /health's thread `name` ("p:thread" runs in pids[p], a bare name in pids[""])."""
  return pids[name.split(":", 1)[0]] if ":" in name else pids[""]


def _timed(url, pid, run) -> dict:
  """run() -> a level's row, with the server's counts over it from /health (compiles; decode rows per decode
  chunk: occupancy) and its CPU seconds per request (user + system time of its processes: `pid`, or the engine's
  and the front ends' with --api-procs)."""
  before = health(url)
  pids = _pids(before, pid)
  cpu = sum(cpu_seconds(p) for p in pids.values())
  tids = before.get("threads", {})
  thread_cpu = {name: cpu_seconds(_thread_pid(name, pids), tid) for name, tid in tids.items()}
  row = run()
  after = health(url)
  cpu = sum(cpu_seconds(p) for p in pids.values()) - cpu
  chunk = {k: k if k.startswith("decode_") else f"decode_{k}" for k in CHUNK_STATS}  # /health's names of them
  for k in ("prefill_tokens", "prefix_hit_tokens", "compiles", "decode_rows", *chunk.values()):
    row[k] = after.get(k, 0) - before.get(k, 0)  # (a server older than the decode counts has none)
  row["rows_per_chunk"] = row["decode_rows"] / max(row["decode_calls"], 1)
  row.update(chunk_ms({k: row[h] for k, h in chunk.items()}))
  row["server_cpu_ms_req"] = 1e3 * cpu / row["requests"]
  threads = {name: cpu_seconds(_thread_pid(name, pids), tid) - thread_cpu[name] for name, tid in tids.items()}
  row["thread_cpu_ms_chunk"] = thread_cpu_ms(threads, cpu, max(row["decode_calls"], 1))
  row["processes"] = len(pids)
  return row


def shared_level(url, pid, args) -> dict:
  """The shared-system-prompt case (module docstring) on the server at `url`: the timed round's row with
  the server's prefilled and prefix-hit prompt tokens."""
  c = args.shared_clients
  for k in (1, 2):  # untimed, other questions: compile (the second: the shapes of cached system prompts)
    _level(url, c, 1, args.new_tokens, args.temperature, (args.system_tokens, k * c), client_procs(args, c),
           args.client)
  return _timed(url, pid, lambda: _level(url, c, 1, args.new_tokens, args.temperature, (args.system_tokens, 0),
                                         client_procs(args, c), args.client))


def run_server(args, out, levels, shared: bool, extra=()):
  """({clients: row} of the plain levels, the shared case's row or None) of one server process started with
  the benchmark's arguments plus `extra`."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(gpu.REPO), os.environ.get("PYTHONPATH", "")]))
  log = out / "serve_log.sqlite"
  for p in out.glob("serve_log.sqlite*"):
    p.unlink()
  server_log = out / f"server{''.join(extra).replace('--', '_')}.log"  # one per server of the run
  proc, url = spawn_server([*server_args(args, free_port(), log), *extra], env=env, log_path=server_log,
                           timeout=1800, poll_s=0.5)
  try:
    rows = {}
    for c in levels:
      for _ in range(2):  # untimed: compile this level's shapes (the second: those of prompts cached by the first)
        _level(url, c, 1, args.new_tokens, args.temperature, procs=client_procs(args, c), kind=args.client)
      rows[c] = _timed(url, proc.pid, lambda: _level(url, c, args.rounds, args.new_tokens, args.temperature,
                                                     procs=client_procs(args, c), kind=args.client))
      print(f"server   clients={c}: {rows[c]}", flush=True)
      atomic_write_json(out / f"serve{''.join(extra).replace('--', '_').replace(' ', '')}.json",
                        {"partial": "server levels so far; the ceiling comes last", "args": vars(args),
                         "server": rows}, indent=2)
    row = shared_level(url, proc.pid, args) if shared else None
    if row is not None:
      print(f"shared   clients={args.shared_clients} {' '.join(extra) or 'prefix cache'}: {row}", flush=True)
    return rows, row
  finally:
    proc.terminate()
    proc.wait(timeout=60)


def run_ceiling(args):
  """{clients: decode-ceiling row} of the server's engine (module docstring), built in this process."""
  import jax
  from fineflax.engine import Request
  from fineflax.sampling.chat import chat_prompt_ids
  from fineflax.serve.__main__ import parse_args as serve_parse
  from fineflax.serve.build import build
  server, _ = build(serve_parse(server_args(args, 0, ":memory:")))
  engine = server.engine.driver.engine  # the server's engine, not started: driven here
  tok = server.engine.tokenizer
  prompt = chat_prompt_ids(tok, PROMPT)

  def wave(c, seed):
    seqs = [engine.submit(Request(prompt, max_new_tokens=0, hold=True, reserve=args.new_tokens,
                                  temperature=args.temperature,
                                  eos_ids=(), key=jax.random.fold_in(jax.random.key(seed), i))) for i in range(c)]
    engine.run()  # admission and prefill only (no budget yet)
    for s in seqs:
      engine.resume(s, args.new_tokens)
    before = {k: engine.stats[k] for k in CHUNK_STATS}
    t0 = time.perf_counter()
    engine.run()  # decode chunks of all c rows
    wall = time.perf_counter() - t0
    tokens = sum(len(s.tokens) for s in seqs)
    for s in seqs:
      engine.release(s)
    return tokens, wall, chunk_ms({k: engine.stats[k] - before[k] for k in CHUNK_STATS})

  rows = {}
  for c in args.levels:
    wave(c, 0)  # compiles
    tokens, wall, chunk = wave(c, 1)
    rows[c] = {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, **chunk}
    print(f"ceiling  clients={c}: {rows[c]}", flush=True)
  return rows


def tiny_model(out: pathlib.Path) -> str:
  from fineflax.testing.serve import tiny_chat_model
  return tiny_chat_model(out)


def random_smollm2(out: pathlib.Path) -> str:
  """An HF folder of random SmolLM2-135M-shaped weights (N(0, 0.02), norms 1) with the bundled tokenizer."""
  from benchmarks.sampler import SHAPES
  from fineflax.testing.serve import random_chat_model
  return random_chat_model(out, "random_smollm2", {**SHAPES["SmolLM2-135M"], "max_position_embeddings": 8192},
                           std=0.02, norm_std=0.0)


def main(argv=None):
  args = parse_args(argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  # before jax is imported (the tiny model imports it): this process (the ceiling) reads them too
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str((out / "jax_cache").resolve()))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")  # the server inherits both
  if args.tiny:
    args.model = tiny_model(out)
  elif args.random_weights:
    args.model = random_smollm2(out)
  t0 = time.perf_counter()
  servers, shared_on = {}, None
  for i, k in enumerate(args.api_procs_list):  # the shared-prompt case with the first variant only
    servers[k], shared = run_server(args, out, args.levels, args.shared_clients > 0 and i == 0,
                                    ["--api-procs", str(k)])
    shared_on = shared_on or shared
  shared_off = run_server(args, out, [], True, ["--no-prefix-cache"])[1] if args.shared_clients else None
  ceiling = run_ceiling(args)
  device = gpu.device_name()
  command = "python -m benchmarks.serve " + " ".join(sys.argv[1:] if argv is None else argv)
  rows = []
  for k, server in servers.items():
    first = server[args.levels[0]]["ttft_p50_s"]
    rows += [[k, c, server[c]["tok_s"], ceiling[c]["tok_s"], server[c]["tok_s"] / ceiling[c]["tok_s"],
              server[c]["ttft_p50_s"], server[c]["ttft_p50_s"] / first, server[c]["req_s"],
              server[c]["rows_per_chunk"], server[c]["server_cpu_ms_req"], server[c]["client_procs"],
              server[c]["client_cpu"], server[c]["compiles"], chunk_ms_cell(server[c]), chunk_ms_cell(ceiling[c]),
              " / ".join(f"{v:.1f}" for v in server[c].get("thread_cpu_ms_chunk", {}).values())]
             for c in args.levels]
  table = markdown_table(
      ["API procs", "clients", "server tok/s", "decode ceiling tok/s", "server / ceiling", "p50 TTFT s",
       f"TTFT / TTFT at {args.levels[0]}", "server req/s", "rows / decode chunk", "server CPU ms / request",
       "client procs", "client CPU", "compiles in timed level", "server: call / wait / gap ms a chunk",
       "ceiling: call / wait / gap ms a chunk", "server CPU ms a chunk: engine / emit / loop / other threads"], rows)
  md = (f"Device: {device}. Command: `{command}` ({time.perf_counter() - t0:.0f} s).\n"
        f"Model {args.model}, quant {args.quant}, {args.dtype}, {args.new_tokens} new tokens (ignore_eos), "
        f"temperature {args.temperature:g}, "
        f"{args.rounds} timed streaming requests per client ({args.client} clients), slots = {args.slots}, "
        f"chunk {args.chunk}, "
        f"context {args.context}. Targets: server / ceiling >= 0.7 at 128 clients; TTFT at 32 <= 2x at 1.\n\n"
        f"{table}\n")
  if shared_on is not None:
    rows = [[name, r["requests"], r["prompt_tokens"], r["prefill_tokens"], r["prefix_hit_tokens"],
             r["prefill_tokens"] / max(r["prompt_tokens"], 1), r["tok_s"], r["ttft_p50_s"], r["compiles"]]
            for name, r in (("on", shared_on), ("off (--no-prefix-cache)", shared_off))]
    md += (f"\nShared system prompt: {args.shared_clients} clients, one timed request each after two untimed "
           f"rounds (about {args.system_tokens} system tokens + a question of their own; server counts over the "
           "timed round):\n\n" + markdown_table(
               ["prefix cache", "requests", "prompt tokens", "prefilled tokens", "prefix-hit tokens",
                "prefilled / prompt", "server tok/s", "p50 TTFT s", "compiles in timed level"], rows) + "\n")
  atomic_write_json(out / "serve.json", {"device": device, "args": vars(args), "server": servers,
                                         "ceiling": ceiling, "shared": {"on": shared_on, "off": shared_off}},
                    indent=2)
  atomic_write_text(out / "serve.md", md)
  print(md)
  if args.results:
    write_section("serve-engine", "## Server on the engine (issue 30): tokens/s vs the decode ceiling, TTFT\n\n"
                  "(The section `serve` above holds the numbers of the server before the engine.)\n\n" + md)


if __name__ == "__main__":
  main()
