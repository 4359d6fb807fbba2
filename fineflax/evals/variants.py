"""Variants: what answers the eval prompts.

  "http://127.0.0.1:8000/v1#MODEL"   an OpenAI-compatible endpoint and a model name (via the `openai` package;
                                     the key comes from OPENAI_API_KEY, else "none")
  "SOURCE[+ADAPTER_DIR]"            a local model (HF folder, .gguf, alias such as smollm2-135m-instruct) and
                                     optionally a PEFT LoRA folder, run in-process by fineflax.sampling.generate

A variant is a callable `list of message lists -> list of answers` (greedy unless a temperature is set).
"""
from __future__ import annotations

import os
from typing import Callable, Sequence

Variant = Callable[[Sequence[list[dict]]], list[str]]


def parse_spec(spec: str) -> dict:
  """{"kind": "http", "url", "model"} or {"kind": "local", "source", "adapter"}; bad specs raise ValueError."""
  if not spec or not spec.strip():
    raise ValueError("empty variant spec; give URL#MODEL or SOURCE[+ADAPTER]")
  if spec.startswith(("http://", "https://")):
    url, sep, model = spec.partition("#")
    if not sep or not model:
      raise ValueError(f"variant {spec!r}: an endpoint needs a model name after '#', e.g. {url}#mymodel")
    return {"kind": "http", "url": url.rstrip("/"), "model": model}
  source, _, adapter = spec.partition("+")
  return {"kind": "local", "source": source, "adapter": adapter or None}


def check_endpoint(url: str, model: str, *, api_key: str | None = None, timeout: float = 10.0) -> None:
  """Before any model loads: ValueError when `url` cannot be reached, refuses the key, or lists its models
  (GET {url}/models) without `model`. An endpoint that answers the listing with another status is taken at
  its word (not every OpenAI-compatible server lists models)."""
  import openai
  client = openai.OpenAI(base_url=url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
                         timeout=timeout, max_retries=0)
  try:
    served = [m.id for m in client.models.list()]
  except openai.APIConnectionError as e:  # refused, unreachable or timed out
    raise ValueError(f"cannot connect ({e}); is the server running?") from None
  except openai.AuthenticationError:
    raise ValueError("the endpoint refused the key (set OPENAI_API_KEY)") from None
  except openai.APIStatusError:
    return
  if model not in served:
    raise ValueError(f"the endpoint serves no model {model!r} (served: {', '.join(served) or 'none'})")


def check_local(source: str, adapter: str | None = None) -> None:
  """Before any model loads: FileNotFoundError when the adapter folder is not a PEFT folder or `source` is
  neither a path nor an alias (`fineflax.models.load.check_source`)."""
  from fineflax.lora.peft_io import peft_files
  from fineflax.models.load import check_source
  if adapter:
    peft_files(adapter)
  check_source(source)


def check_spec(spec: str, *, api_key: str | None = None) -> None:
  """`check_endpoint` or `check_local` of a variant spec (ValueError / FileNotFoundError naming the fault)."""
  p = parse_spec(spec)
  if p["kind"] == "http":
    check_endpoint(p["url"], p["model"], api_key=api_key)
  else:
    check_local(p["source"], p["adapter"])


def http_variant(url: str, model: str, *, max_tokens: int = 256, temperature: float = 0.0,
                 api_key: str | None = None, timeout: float = 300.0) -> Variant:
  import openai
  client = openai.OpenAI(base_url=url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
                         timeout=timeout, max_retries=2)

  def run(prompts):
    out = []
    for messages in prompts:
      r = client.chat.completions.create(model=model, messages=messages, temperature=temperature,
                                         max_tokens=max_tokens)
      out.append(r.choices[0].message.content or "")
    return out
  return run


def load_local(source: str, adapter: str | None = None, *, quant: str = "none", dtype: str = "auto"):
  """(params, model config, tokenizer, lora or None, lora scale, jnp dtype): base `source` (quantised per
  `quant` on the adapter's targets, or all linears) + optional PEFT adapter folder; dtype "auto" is
  `fineflax.models.dtype.resolve_dtype`'s (f32 on CPU, bf16 on accelerators)."""

  from fineflax import lora as lora_lib
  from fineflax.models import load
  from fineflax.models.quantize import quantize_params
  from fineflax.models.dtype import resolve_dtype
  jdtype = resolve_dtype(dtype)
  params, config, tokenizer = load(source, dtype=jdtype)
  lora, scale = None, 1.0
  if adapter:
    lora, cfg = lora_lib.import_peft(adapter, config)
    scale = lora_lib.lora_scale(cfg)
    targets = tuple(lora)
  else:
    from fineflax.models import LINEAR_NAMES
    targets = tuple(LINEAR_NAMES)
  if quant != "none":
    params = quantize_params(params, targets=targets, kind=quant)
  return params, config, tokenizer, lora, scale, jdtype


def local_variant(source: str, adapter: str | None = None, *, max_tokens: int = 256, temperature: float = 0.0,
                  quant: str = "none", batch_size: int = 16, dtype: str = "auto", seed: int = 0) -> Variant:
  """Base `source` (quantised per `quant` on the adapter's targets, or all linears) + optional PEFT adapter."""
  loaded = load_local(source, adapter, quant=quant, dtype=dtype)
  return lambda prompts: generate_answers(loaded, prompts, max_tokens=max_tokens, temperature=temperature,
                                          batch_size=batch_size, seed=seed)


def generate_answers(loaded, prompts, *, max_tokens: int, temperature: float, batch_size: int, seed: int) -> list[str]:
  """Answers of a model `loaded` by `load_local` to chat prompts, `batch_size` at a time (batch i samples
  with key PRNGKey(seed + i))."""
  import jax

  from fineflax.sampling import chat_prompt_ids, generate
  params, config, tokenizer, lora, scale, jdtype = loaded
  texts = []
  for i in range(0, len(prompts), batch_size):
    ids = [chat_prompt_ids(tokenizer, m) for m in prompts[i:i + batch_size]]
    out = generate(params, config, ids, max_new_tokens=max_tokens, temperature=temperature, tokenizer=tokenizer,
                   lora=lora, lora_scale=scale, dtype=jdtype, rng=jax.random.PRNGKey(seed + i))
    texts += list(out.texts)
  return texts


def make_variant(spec: str, **kwargs) -> Variant:
  p = parse_spec(spec)
  if p["kind"] == "http":
    kwargs = {k: v for k, v in kwargs.items() if k in ("max_tokens", "temperature", "api_key")}
    return http_variant(p["url"], p["model"], **kwargs)
  kwargs.pop("api_key", None)
  return local_variant(p["source"], p["adapter"], **kwargs)
