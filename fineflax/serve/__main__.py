"""`python -m fineflax.serve --model SOURCE [--adapter NAME=PATH ...] [--quant nf4|int8|none] --port P`.

An OpenAI-compatible chat server (see `fineflax.serve.app`) over one base model, optionally quantised,
with PEFT LoRA adapters served in the same batches, RAG variants over them (`--rag-config FILE`, or
`--retriever` and `--rag` flags: `fineflax.rag.spec`), a SQLite reward log and a contextual bandit router
for model="auto" (per request category, priors from the RAG config).
"""
from __future__ import annotations

import argparse
import sys

from fineflax.models.dtype import DTYPE_CHOICES
from fineflax.serve.build import UsageError, build_engine, build_server, check_args


def parse_args(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(prog="python -m fineflax.serve", description=__doc__.splitlines()[0])
  ap.add_argument("--model", required=True, help="HF folder, .gguf file or alias (smollm2-135m-instruct)")
  ap.add_argument("--name", default=None, help="model name clients use for the base (default: from --model)")
  ap.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                  help="a PEFT LoRA folder served as model NAME (repeatable)")
  ap.add_argument("--quant", choices=("nf4", "int8", "none"), default="nf4",
                  help="quantisation of the base's linear kernels (default nf4)")
  ap.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                  help="compute dtype (default auto: bfloat16 on a GPU, float32 on CPU)")
  ap.add_argument("--host", default="127.0.0.1")
  ap.add_argument("--port", type=int, default=8000)
  ap.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
  ap.add_argument("--slots", type=int, default=8, help="decode slots (rows of the running batch)")
  ap.add_argument("--context", type=int, default=2048, help="tokens per slot (prompt + completion)")
  ap.add_argument("--chunk", type=int, default=8, help="decode steps per engine call")
  ap.add_argument("--api-procs", type=int, default=None,
                  help="HTTP front ends in processes of their own, the engine in this one (fineflax.serve.split: "
                       "the event loop and the engine stop sharing one GIL); 0: one process (default: 1 on a "
                       "GPU or TPU, 0 on the CPU)")
  ap.add_argument("--api-restarts", type=int, default=5,
                  help="with --api-procs: a front end that exits is restarted (its requests in flight fail, the "
                       "others are served on) at most this many times a minute over all front ends; past it the "
                       "server stops with status 1 for a supervisor. 0: the first exit stops the server")
  ap.add_argument("--prefill-tokens", type=int, default=2048,
                  help="prompt tokens prefilled per engine step at most, then a decode chunk runs "
                       "(raised to the engine's 512-token prefill block if smaller)")
  ap.add_argument("--pages", type=int, default=None,
                  help="KV pages in the pool, trash page included (default: --slots x (pages of --context + 1) + 1, "
                       "so no row ever waits for pages; fewer: rows also wait for pages to free up, and a request "
                       "that needs more than the whole pool gets 400)")
  ap.add_argument("--max-waiting", type=int, default=None,
                  help="rows (n per request) that may wait for a decode slot; past it requests get 429 with "
                       "Retry-After (default 4 x --slots; 0: unbounded)")
  ap.add_argument("--queue-timeout", type=float, default=30.0,
                  help="seconds a request may wait for a decode slot before it gets 503 with Retry-After "
                       "(default 30; 0: no deadline)")
  ap.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                  help="prefill every prompt in full (default: reuse the KV pages of prefixes seen before)")
  ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                  help="compile every program the engine can meet (decode chunks for each row bucket up to "
                       "--slots, table width up to --context and sampling filter; the prefills --prefill-tokens "
                       "allows) before serving, so no request waits for a compile (default: on unless the "
                       "backend is the CPU)")
  ap.add_argument("--max-tokens-limit", type=int, default=1024, help="largest max_tokens accepted")
  ap.add_argument("--max-n", type=int, default=8, help="largest n accepted")
  ap.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413")
  ap.add_argument("--keep-alive-timeout", type=float, default=5.0, help="close idle keep-alive connections after s")
  ap.add_argument("--idle-timeout", type=float, default=10.0,
                  help="close connections silent for s before or within a request (headers or body)")
  ap.add_argument("--log", default="serve_log.sqlite", help="SQLite reward log (created if absent)")
  ap.add_argument("--log-sync", choices=("FULL", "NORMAL"), default="FULL",
                  help="SQLite synchronous setting (FULL: each acknowledged write is fsynced)")
  ap.add_argument("--router", choices=("ucb1", "thompson"), default="ucb1", help="bandit for model=auto")
  ap.add_argument("--reward-min", type=float, default=-1.0, help="smallest reward /feedback accepts")
  ap.add_argument("--reward-max", type=float, default=1.0,
                  help="largest reward /feedback accepts (rewards outside the range in the log are clipped)")
  ap.add_argument("--auto-variants", default=None,
                  help="comma-separated variants model=auto routes among (default: base, adapters, RAG variants)")
  ap.add_argument("--rag-config", default=None,
                  help="JSON file of RAG variants, retrievers, categories and priors (fineflax.rag.spec)")
  ap.add_argument("--rag", action="append", default=[], metavar="NAME:key=value,...",
                  help="a RAG variant, e.g. naive_rag:retriever=dense,k=3,generator=alpha (repeatable)")
  ap.add_argument("--retriever", action="append", default=[], metavar="NAME:key=value,...",
                  help="a retriever, e.g. dense:kind=vector,corpus=kb.jsonl or web:url=http://h:p/retrieve")
  ap.add_argument("--no-contextual", dest="contextual", action="store_false",
                  help="route model=auto on overall statistics only (categories still logged and reported)")
  ap.add_argument("--seed", type=int, default=None, help="the router's random seed (Thompson draws)")
  args = ap.parse_args(argv)
  if not args.reward_min < args.reward_max:
    ap.error(f"--reward-min {args.reward_min:g} --reward-max {args.reward_max:g}: need min < max")
  if args.max_waiting is not None and args.max_waiting < 0:
    ap.error(f"--max-waiting {args.max_waiting}: must be >= 0 (0: unbounded)")
  if not args.queue_timeout >= 0:
    ap.error(f"--queue-timeout {args.queue_timeout:g}: must be >= 0 (0: no deadline)")
  if args.pages is not None and args.pages < 2:
    ap.error(f"--pages {args.pages}: the pool needs the trash page and at least one more")
  if args.api_procs is not None and args.api_procs < 0:
    ap.error(f"--api-procs {args.api_procs}: must be >= 0 (0: the front end in the engine's process)")
  if args.api_restarts < 0:
    ap.error(f"--api-restarts {args.api_restarts}: must be >= 0 (0: a front end's exit stops the server)")
  if args.prefill_tokens < 1:
    ap.error(f"--prefill-tokens {args.prefill_tokens}: must be >= 1")
  for name in ("keep_alive_timeout", "idle_timeout"):
    if not getattr(args, name) > 0:
      ap.error(f"--{name.replace('_', '-')} {getattr(args, name):g}: must be > 0")
  for spec in args.adapter:
    if "=" not in spec or not spec.split("=", 1)[0] or not spec.split("=", 1)[1]:
      ap.error(f"--adapter {spec!r}: expected NAME=PATH")
  return args


def main(argv=None) -> int:
  """Checks the arguments and binds the port before loading the model, then serves until stopped.
  A user mistake (bad --model / --adapter, a busy port) prints one line and returns 2."""
  import uvicorn
  from fineflax.serve.app import uvicorn_config
  from retrieval.server import PortUnavailable, bind_socket
  args = parse_args(argv)
  try:
    checked = check_args(args)
    sock = bind_socket(args.host, args.port)
  except (UsageError, PortUnavailable) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"fineflax.serve: {args.host}:{sock.getsockname()[1]} bound; loading {args.model}", file=sys.stderr,
        flush=True)
  try:
    engine = build_engine(args, checked)
  except UsageError as e:
    sock.close()
    print(f"error: {e}", file=sys.stderr)
    return 2
  port = sock.getsockname()[1]
  if args.api_procs is None:
    import jax
    args.api_procs = 0 if jax.default_backend() == "cpu" else 1
  rag = sorted(checked[4].variants) if checked[4] else []
  print(f"fineflax.serve: {checked[2]} + adapters {sorted(engine.adapter_ids)} + RAG {rag} on "
        f"http://{args.host}:{port}/v1 (log {args.log}"
        f"{f'; {args.api_procs} front-end processes' if args.api_procs else ''})", file=sys.stderr, flush=True)
  if args.api_procs:
    from fineflax.serve.split import serve_split
    return serve_split(args, engine, sock, checked[2:])
  server, app = build_server(args, engine, *checked[2:])
  uvicorn.Server(uvicorn_config(app, args.host, port, keep_alive_timeout=args.keep_alive_timeout,
                                idle_timeout=args.idle_timeout)).run(sockets=[sock])
  return 0


if __name__ == "__main__":
  sys.exit(main())
