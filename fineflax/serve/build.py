"""The server's parts from parsed arguments (`python -m fineflax.serve`'s, `__main__.parse_args`): their checks before
any weight loads (`check_args`), the engine (`build_engine`: weights, warm-up), the app on an engine of this process
or another (`build_server`, also `serve.split`'s front ends), both in one process (`build`)."""
from __future__ import annotations

import argparse
import pathlib
import sys

SWITCH_INTERVAL_S = 0.0005  # sys.setswitchinterval of the server's processes (see `build_engine`)


class UsageError(ValueError):
  """A bad argument, found before the weights load: one line and exit code 2."""


def check_args(args: argparse.Namespace):
  """(model config, {name: (lora, lora config)}, base name, auto variants, RagConfig | None) from the
  model's metadata, the adapter files and the RAG declarations alone, before any weight is loaded; a bad
  --model, --adapter, --name, --auto-variants, --rag-config, --rag or --retriever raises UsageError naming it."""
  from fineflax.lora import import_peft
  from fineflax.lora.peft_io import peft_files
  from fineflax.models import load_config
  from fineflax.rag.spec import RagConfigError, from_args
  try:
    rag = from_args(args.rag_config, args.rag, args.retriever)
  except RagConfigError as e:
    raise UsageError(str(e)) from None
  for spec in args.adapter:  # the files first: reading the model's metadata can take seconds
    try:
      peft_files(spec.split("=", 1)[1])
    except FileNotFoundError as e:
      raise UsageError(f"--adapter {spec}: {e}") from None
  try:
    config = load_config(args.model)
  except (OSError, ValueError, KeyError) as e:
    raise UsageError(f"--model {args.model}: {e}") from None
  adapters = {}
  for spec in args.adapter:
    name, path = spec.split("=", 1)
    if name in adapters or name == "auto":
      raise UsageError(f"--adapter {spec}: the name {name!r} is taken")
    try:
      adapters[name] = import_peft(path, config)
    except (OSError, ValueError, KeyError) as e:
      raise UsageError(f"--adapter {spec}: {e}") from None
  base = args.name or pathlib.Path(str(args.model).rstrip("/")).stem
  if base in adapters:
    raise UsageError(f"--adapter {base}=...: the name is the base model's (rename it or pass --name)")
  for name, v in rag.variants.items():
    if name in adapters or name in (base, "auto"):
      raise UsageError(f"RAG variant {name}: the name is taken by a served model")
    if v.generator is not None and v.generator != base and v.generator not in adapters:
      raise UsageError(f"RAG variant {name}: generator={v.generator!r} is not served (served: "
                       f"{[base, *adapters]})")
  known = [base, *adapters, *rag.variants]
  variants = known
  if args.auto_variants:
    variants = [v.strip() for v in args.auto_variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in known]
    if unknown:
      raise UsageError(f"--auto-variants: unknown {unknown}; known: {known}")
  unknown = [v for v in rag.priors if v not in variants]
  if unknown:
    raise UsageError(f"priors for {unknown}: not among the variants model=auto routes ({variants})")
  return config, adapters, base, variants, (rag if rag.variants else None)


def build_engine(args: argparse.Namespace, checked):
  """The server's `serve.engine.Engine` (not started) from parsed arguments and `check_args`'s result: loads the
  weights; compiles its programs first with --warmup."""
  import jax
  import jax.numpy as jnp
  from fineflax.models import load
  from fineflax.models.dtype import resolve_dtype
  from fineflax.serve.engine import Engine

  adapters = checked[1]
  # The engine thread must get the GIL back as soon as a decode chunk returns (the device idles until it
  # starts the next), while the event loop and the emitter thread turn the last chunk into events: a thread
  # waiting for the GIL waits up to the switch interval, 5 ms by default (a chunk of SmolLM2 on an H200).
  sys.setswitchinterval(SWITCH_INTERVAL_S)
  params, config, tokenizer = load(args.model, dtype=jnp.float32, quant=args.quant)
  if tokenizer is None:
    raise UsageError(f"--model {args.model}: no tokenizer found; the server needs one")
  engine = Engine(params, config, tokenizer, adapters=adapters, slots=args.slots, context=args.context,
                  dtype=resolve_dtype(args.dtype), chunk=args.chunk, prefill_tokens=args.prefill_tokens,
                  prefix_cache=args.prefix_cache, num_pages=args.pages,
                  max_waiting=(4 * args.slots if args.max_waiting is None else args.max_waiting) or None,
                  queue_timeout=args.queue_timeout or None)
  if args.warmup if args.warmup is not None else jax.default_backend() != "cpu":
    count, seconds, compiled = engine.warm_up()
    print(f"warm-up: {count} programs in {seconds:.1f} s ({compiled} XLA compiles, the rest from the "
          "persistent compilation cache)", file=sys.stderr, flush=True)
  return engine


def build_server(args: argparse.Namespace, engine, base: str, variants: list, rag):
  """(Server, Starlette app) on `engine` (in this process, or a `serve.remote.RemoteEngine`): the reward log, the
  router and the RAG variants (base name, auto variants and RagConfig | None from `check_args`)."""
  from fineflax.serve.app import Server, create_app
  from fineflax.serve.feedback import FeedbackLog
  from fineflax.serve.rag import RagRuntime
  from fineflax.serve.router import ContextualRouter
  log = FeedbackLog(args.log, synchronous=args.log_sync, reward_range=(args.reward_min, args.reward_max))
  router = ContextualRouter(variants, kind=args.router, seed=args.seed, contextual=args.contextual,
                            priors=rag.priors if rag else None).load(log.reward_sums(by_category=True))
  server = Server(engine, base_name=base, log=log, router=router, api_key=args.api_key,
                  max_body_bytes=args.max_body_bytes, max_tokens_limit=args.max_tokens_limit,
                  max_n=args.max_n, rag=RagRuntime.build(rag) if rag else None)
  return server, create_app(server)


def build(args: argparse.Namespace, checked=None):
  """(Server, Starlette app) in one process from parsed arguments; loads the model (after `check_args`, or its
  result `checked`)."""
  checked = checked or check_args(args)
  return build_server(args, build_engine(args, checked), *checked[2:])
