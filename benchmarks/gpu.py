"""Helpers for GPU benchmarks and experiments: device name, peak memory, step timing, one fresh subprocess
per case, the command line that ran.

Import-light on purpose: neither jax nor torch is imported here, so a parent process that only
orchestrates workers never touches the GPU (its memory and JAX's preallocation stay out of the numbers).

  name = device_name()                             # "NVIDIA H100 80GB HBM3" | "cpu (x86_64)"
  result = run_worker(worker_argv(__spec__.name, "--worker", json.dumps(spec)), env=jax_env())
  # in the worker:  dt = time_steps(step, n, sync);  peak = jax_peak_bytes() or torch_peak_bytes()
  #                 print_result(dict)             # the one line run_worker parses
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time
from typing import Callable

RESULT_PREFIX = "BENCH_RESULT_JSON: "
GIB = 1024 ** 3
REPO = pathlib.Path(__file__).resolve().parents[1]  # scripts and their workers run as modules from here


def worker_argv(module: str, *args: str) -> list[str]:
  """[python, -m, module, *args]: a benchmark's worker, run as a module (pass the script's `__spec__.name`)
  from `REPO`, as `run_worker` does."""
  return [sys.executable, "-m", module, *args]


def command_line() -> str:
  """The command that started this process as it is typed from the repository root: "python -m
  benchmarks.sft --out x" for a module, else "python <path relative to the root> ..."."""
  spec = getattr(sys.modules["__main__"], "__spec__", None)
  program = f"-m {spec.name}" if spec is not None else os.path.relpath(sys.argv[0], REPO)
  return " ".join(["python", program, *sys.argv[1:]])


def device_name() -> str:
  """First GPU's name from `nvidia-smi`, else "cpu (<machine>)"."""
  if shutil.which("nvidia-smi"):
    try:
      out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30, check=True).stdout
      names = [line.strip() for line in out.splitlines() if line.strip()]
      if names:
        return names[0] + (f" (x{len(names)} visible)" if len(names) > 1 else "")
    except (subprocess.SubprocessError, OSError):
      pass
  return f"cpu ({platform.machine()})"


def jax_env(**extra: str) -> dict[str, str]:
  """Environment for a JAX worker: no preallocation, so `peak_bytes_in_use` is the program's own peak."""
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", TF_CPP_MIN_LOG_LEVEL="2")
  env.update(extra)
  return env


def run_worker(argv: list[str], env: dict[str, str] | None = None, timeout: float = 600.0) -> dict:
  """Runs `argv`, streams its stderr, returns the dict it printed with `print_result`.

  A failing or silent worker gives {"error": "<last lines of its output>"} instead of raising, so one
  out-of-memory case does not lose the rest of a benchmark.
  """
  try:
    proc = subprocess.run(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout:.0f}s"}
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith(RESULT_PREFIX):
      return json.loads(line[len(RESULT_PREFIX):])
  tail = " | ".join(proc.stdout.strip().splitlines()[-3:])
  return {"error": f"exit code {proc.returncode}; no result line. {tail}"[:500]}


def print_result(result: dict) -> None:
  """The worker's answer: one line `BENCH_RESULT_JSON: {...}` on stdout."""
  sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
  sys.stdout.flush()


def time_steps(step: Callable[[], None], n: int, sync: Callable[[], None]) -> float:
  """Seconds for `n` calls of `step`, with `sync()` (device barrier) before starting and after the last."""
  sync()
  t = time.perf_counter()
  for _ in range(n):
    step()
  sync()
  return time.perf_counter() - t


def jax_peak_bytes() -> int | None:
  """Peak bytes in use on JAX's first device since the process started (None where unsupported, e.g. CPU)."""
  import jax
  stats = jax.devices()[0].memory_stats()
  return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def jax_bytes_in_use() -> int | None:
  """The most bytes in use now on any local device (None without memory stats: the CPU)."""
  import jax
  stats = [d.memory_stats() or {} for d in jax.local_devices()]
  return max((s["bytes_in_use"] for s in stats if "bytes_in_use" in s), default=None)


def jax_copy_bandwidth(nbytes: int, reps: int = 10) -> float:
  """Device copy bandwidth in bytes/s: 2 * nbytes * reps / time of `reps` calls of a donated jitted
  `x + 1` over a bf16 array of `nbytes` (bytes read and written; donated: no allocation per call)."""
  import jax
  import jax.numpy as jnp
  x = jnp.ones((nbytes // 2,), jnp.bfloat16)
  add = jax.jit(lambda x: x + 1, donate_argnums=0)
  x = add(x).block_until_ready()
  t = time.perf_counter()
  for _ in range(reps):
    x = add(x)
  x.block_until_ready()
  return 2 * nbytes * reps / (time.perf_counter() - t)


def jax_device_name() -> str:
  import jax
  d = jax.devices()[0]
  return f"{d.platform}: {d.device_kind}"


def torch_peak_bytes() -> int | None:
  """torch.cuda.max_memory_allocated() since the last reset (None without CUDA)."""
  import torch
  return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None


def torch_device_name() -> str:
  import torch
  return f"cuda: {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "cpu"


def torch_random_llama(shape: dict, device: str):
  """A transformers LlamaForCausalLM of `shape` (the benchmarks' shape dicts), bf16, eval mode, weights
  N(0, 0.02) and norms 1, built on `device` without the default initialisation."""
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM
  from transformers.initialization import no_init_weights
  rope = dict(shape.get("rope_scaling") or ())
  theta = shape.get("rope_theta", 10000.0)
  cfg = LlamaConfig(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                    intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_layers"],
                    num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
                    head_dim=shape["head_dim"], rms_norm_eps=shape.get("rms_norm_eps", 1e-5),
                    tie_word_embeddings=True, max_position_embeddings=131072,
                    rope_parameters=dict(rope, rope_theta=theta) if rope else {"rope_type": "default", "rope_theta": theta})
  with no_init_weights(), torch.device(device):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.normal_(0, 0.02) if p.ndim > 1 else p.fill_(1.0)
  return model


def time_torch_lora_steps(model, forward, tokens, *, lr: float, warmup: int, steps: int,
                          reset_peak_after_warmup: bool = False) -> dict:
  """Times AdamW steps (bf16 autocast, LM loss on `tokens`, clip 1.0) of a peft model's trainable params.

  `forward` is `model` or a compiled wrapper of it. Returns seconds per step, the first step's time
  (compile / warm-up), the last loss, torch's peak bytes, the device name and library versions.
  """
  import math
  import peft
  import torch
  import transformers
  cuda = tokens.device.type == "cuda"
  trainable = [p for p in model.parameters() if p.requires_grad]
  opt = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                          **({"fused": True} if cuda else {"foreach": True}))
  box = {}

  def step():
    with torch.autocast(tokens.device.type, dtype=torch.bfloat16):
      loss = forward(input_ids=tokens, labels=tokens).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    box["loss"] = loss.detach()

  sync = torch.cuda.synchronize if cuda else (lambda: None)
  t0 = time.perf_counter()
  step()
  sync()
  first_s = time.perf_counter() - t0
  for _ in range(warmup - 1):
    step()
  if cuda and reset_peak_after_warmup:
    torch.cuda.reset_peak_memory_stats()  # after warm-up: weights, optimizer state, activations
  dt = time_steps(step, steps, sync)
  loss = float(box["loss"])
  if not math.isfinite(loss):
    raise FloatingPointError(f"torch loss is {loss}")
  return {"seconds": dt, "compile_s": first_s, "loss": loss, "peak_bytes": torch_peak_bytes(),
          "device": torch_device_name(),
          "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                       "peft": peft.__version__}}


def time_jax_steps(compiled, state, params, batch, *, warmup: int, steps: int) -> tuple[float, float]:
  """(seconds per step, last loss) of a compiled `(state, params, batch) -> (state, metrics)` step.

  The state is threaded through the calls (it may be donated); raises if the loss is not finite.
  """
  import math
  import jax
  box = {"state": state, "metrics": None}

  def step():
    box["state"], box["metrics"] = compiled(box["state"], params, batch)

  sync = lambda: jax.block_until_ready((box["state"], box["metrics"]))
  for _ in range(warmup):
    step()
  dt = time_steps(step, steps, sync)
  loss = float(box["metrics"]["loss"])
  if not math.isfinite(loss):
    raise FloatingPointError(f"fineflax loss is {loss}")
  return dt, loss
