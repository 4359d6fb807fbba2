"""Shared fixtures of the server tests: a tiny random Llama with SmolLM2's tokenizer, two PEFT adapters,
and a server (uvicorn in a thread, or `python -m fineflax.serve` in a subprocess) on a free port."""
from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import threading
import time

import jax
import numpy as np


TINY_SHAPE = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16, tie_word_embeddings=True, max_position_embeddings=512)


def tiny_chat_model(root: pathlib.Path) -> str:
  """An HF folder of a tiny random Llama (vocab 49152, tied embeddings) with the bundled SmolLM2
  tokenizer and chat template; written without torch (fineflax's own export path)."""
  return random_chat_model(root, "tiny_chat", TINY_SHAPE, std=0.3, norm_std=0.1)


def random_chat_model(root: pathlib.Path, name: str, shape: dict, std: float, norm_std: float) -> str:
  """An HF folder root/name (made once) of a random Llama of `shape` (`ModelConfig` fields; BOS 1, EOS 2)
  with the bundled SmolLM2 tokenizer and chat template: norms ~ 1 + N(0, norm_std), matrices ~ N(0, std),
  float32 safetensors written from NumPy (no jit compiles, no torch)."""
  import json
  from fineflax.io import atomic_write_text
  from fineflax.models import ModelConfig, init_params, load_tokenizer, state_dict_from_params
  from fineflax.models.safetensors_io import write_safetensors
  path = root / name
  if not (path / "config.json").exists():
    config = ModelConfig(**{"bos_token_id": 1, "eos_token_ids": (2,), **shape})
    rng = np.random.default_rng(0)

    def draw(path, s):
      norm = "norm" in jax.tree_util.keystr(path)
      noise = (norm_std if norm else std) * rng.standard_normal(s.shape)
      return ((1.0 if norm else 0.0) + noise).astype(np.float32)
    shapes = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
    params = jax.tree_util.tree_map_with_path(draw, shapes)
    path.mkdir(parents=True)
    write_safetensors(state_dict_from_params(params, config), path / "model.safetensors",
                      metadata={"format": "pt"})
    atomic_write_text(path / "config.json", json.dumps(config.to_hf()))
    load_tokenizer("smollm2-135m-instruct").save_pretrained(path)
  return str(path)


def write_adapters(model_dir: str, root: pathlib.Path) -> dict[str, str]:
  """Two random PEFT adapters (rank 4, all linears, different weights and scales): {name: path}."""
  import json
  from fineflax import lora as L
  from fineflax.models import ModelConfig
  config = ModelConfig.from_hf(json.loads((pathlib.Path(model_dir) / "config.json").read_text()))
  rng, out = np.random.default_rng(1), {}
  # one shape for both (the reference `generate` compiles once for them; different ranks and targets
  # in one batch are covered by test_serve_engine.py)
  for name, cfg in [("alpha", L.LoraConfig(r=4, alpha=8.0)), ("beta", L.LoraConfig(r=4, alpha=2.0))]:
    lora = {}
    for t in L.resolve_targets(cfg.target_modules):
      n_in, n_out = config.linear_shapes()[t]
      lora[t] = {"a": 0.3 * rng.standard_normal((config.num_layers, n_in, cfg.r)).astype(np.float32),
                 "b": 0.3 * rng.standard_normal((config.num_layers, cfg.r, n_out)).astype(np.float32)}
    out[name] = str(L.export_peft(lora, cfg, config, root / name))
  return out


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def server_argv(model_dir, adapters, log, port, *extra) -> list[str]:
  argv = ["--model", model_dir, "--name", "tiny", "--quant", "nf4", "--dtype", "float32", "--slots", "2",
          "--context", "256", "--chunk", "4", "--max-tokens-limit", "200", "--log", str(log),
          "--port", str(port)]
  for name, path in adapters.items():
    argv += ["--adapter", f"{name}={path}"]
  return argv + list(extra)


@contextlib.contextmanager
def thread_server(argv):
  """Runs the server of `argv` in this process (uvicorn in a thread); yields (base_url, Server)."""
  import uvicorn
  from fineflax.serve.__main__ import parse_args
  from fineflax.serve.build import build
  from fineflax.serve.app import uvicorn_config
  args = parse_args(argv)
  server, app = build(args)
  uv = uvicorn.Server(uvicorn_config(app, "127.0.0.1", args.port, keep_alive_timeout=args.keep_alive_timeout,
                                     idle_timeout=args.idle_timeout))
  thread = threading.Thread(target=uv.run, daemon=True)
  thread.start()
  while not uv.started:
    if not thread.is_alive():
      raise RuntimeError("the server thread died at start")
    time.sleep(0.02)
  try:
    yield f"http://127.0.0.1:{args.port}", server
  finally:
    uv.should_exit = True
    thread.join(timeout=30)
    server.log.close()


def start_subprocess_server(argv, timeout: float = 120.0):
  """`python -m fineflax.serve argv` in a subprocess (this checkout first on PYTHONPATH); returns
  (Popen, base_url) once /health answers."""
  from fineflax.serve.spawn import spawn_server
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pathlib.Path(__file__).parents[2]),
                                                     os.environ.get("PYTHONPATH", "")]))
  return spawn_server(argv, env=env, timeout=timeout)
