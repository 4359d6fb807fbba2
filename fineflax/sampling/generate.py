"""`generate`: one call from prompts to completions, on the engine (continuous batching over a paged KV
cache; `fineflax.engine`; cache="replicas" on a mesh of one process: one engine per device or per
tensor-parallel group, `sampling.replicas`) or, for
cache="static" and other meshes of several devices, on the static session."""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fineflax.engine import Engine, Request
from fineflax.engine.processors import SamplingConfig
from fineflax.engine.prompts import checked_prompts, group_identical, prompts_as_lists
from fineflax.sampling.output import SampleOutput, build_output
from fineflax.sampling.replicas import assign_rows, on_devices, place_replica, replica_mesh, replicas_of
from fineflax.sampling.session import engine_pool_pages, tensor_parallel_mesh, uses_static_cache


def generate(params, config, prompt_tokens, *, max_new_tokens: int, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, eos_ids: Sequence[int] | None = None,
             stop_strings: Sequence[str] = (), tokenizer=None, rng=None, lora=None,
             lora_scale: float = 1.0, dtype=jnp.bfloat16, prompt_mask=None,
             chunk_size: int = 32, mesh=None, impl: str | None = "auto",
             dense_base: bool = False, cache: str = "paged", max_rows: int | None = None,
             page_size: int = 16, attention: str = "auto") -> SampleOutput:
  """Samples up to `max_new_tokens` per prompt; returns a `SampleOutput` of width `max_new_tokens`.

  temperature 0 = greedy. eos_ids: None = the config's (and tokenizer's) EOS ids; () = never stop at
  EOS. stop_strings need `tokenizer`; rows end at their first stop string (see `SamplerSession`).
  Prompts: token lists of any lengths, or an array with `prompt_mask`.
  rng: row r samples with key fold_in(rng, r) (paged; its draws do not depend on the other rows).
  max_rows: rows decoded at once (default all); with fewer, a finished row's place goes to the next prompt.
  Identical prompts are prefilled once and share their pages. page_size / attention: the engine's.
  cache="replicas" with a mesh of several devices of one process splits the rows over its devices, one
  engine each (`replicas`; the same tokens as on one device); max_rows then counts over all of them.
  cache="paged" with a mesh of only a "model" axis of N > 1 devices: one engine decoding tensor-parallel
  over it (`engine.tensor_parallel`); with a data x model mesh (model M < its D devices, one process) the
  rows split over its D / M tensor-parallel groups, one such engine each (`replicas`). cache="static": the
  static-cache sampler (also used for any other mesh of several devices).
  impl: the decoder, "unrolled" or "scan"; "auto": unrolled on GPUs (see `engine.decode.decode_impl`).
  dense_base: decode a quantised base from a dense copy of its dequantised weights (see `SamplerSession`).
  """
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
    raise ValueError(f"generate(max_new_tokens={max_new_tokens!r}): must be an integer >= 1")
  if stop_strings and tokenizer is None:
    raise ValueError(f"stop_strings={tuple(stop_strings)} need a tokenizer (generate(tokenizer=...))")
  prompts = prompts_as_lists(prompt_tokens, prompt_mask)
  if uses_static_cache(cache, mesh):
    from fineflax.sampling.static_session import StaticSession
    session = StaticSession(params, config, max_total_len=max_new_tokens, tokenizer=tokenizer,
                            temperature=temperature, top_k=top_k, top_p=top_p, eos_ids=eos_ids,
                            rng=rng, lora=lora, lora_scale=lora_scale, dtype=dtype,
                            chunk_size=chunk_size, mesh=mesh, impl=impl, dense_base=dense_base)
    session.start(prompts)
    session.decode(max_new_tokens, stop_strings)
    return session.result(width=max_new_tokens)
  sc = SamplingConfig(float(temperature), int(top_k), float(top_p))
  if rng is None and not sc.greedy:
    raise ValueError(f"temperature={temperature} samples: pass rng=jax.random.key(...)")
  prompts = checked_prompts(prompts, config.vocab_size)
  rows = len(prompts) if max_rows is None else int(max_rows)
  if rows < 1:
    raise ValueError(f"max_rows={max_rows}: must be >= 1")
  kw = dict(max_new_tokens=int(max_new_tokens), sc=sc, stop_strings=tuple(stop_strings), page_size=page_size,
            chunk_size=chunk_size, tokenizer=tokenizer, eos_ids=eos_ids, lora_scale=lora_scale, dtype=dtype,
            impl=impl, attention=attention, dense_base=dense_base, mesh=tensor_parallel_mesh(cache, mesh))
  replicas = replicas_of(cache, mesh)
  if not replicas:
    seqs = engine_rows(params, config, prompts, range(len(prompts)), rows, rng=rng, lora=lora, **kw)
    return build_output(seqs, max_new_tokens, tokenizer)
  parts = [p for p in assign_rows(prompts, len(replicas), int(max_new_tokens)) if p]
  per = -(-rows // len(parts))
  used = replicas[:len(parts)]
  placed = {r: place_replica(params, lora, rng, config, r) for r in used}  # see ReplicaSession.start
  outs = on_devices(used, lambda r, part: engine_rows(
      placed[r][0], config, [prompts[i] for i in part], part, min(per, len(part)), lora=placed[r][1],
      rng=placed[r][2], **dict(kw, mesh=replica_mesh(r))), parts)
  seqs = [None] * len(prompts)
  for part, out in zip(parts, outs):
    for r, seq in zip(part, out):
      seqs[r] = seq
  return build_output(seqs, max_new_tokens, tokenizer)


def engine_rows(params, config, prompts, row_ids, rows: int, *, max_new_tokens: int, sc: SamplingConfig,
                rng, stop_strings, page_size, chunk_size, tokenizer, eos_ids, lora, lora_scale, dtype, impl,
                attention, dense_base, mesh=None) -> list:
  """The finished engine sequences of `prompts` decoded `rows` at a time on one engine (default device, or
  tensor-parallel over `mesh`); prompt i samples with key fold_in(rng, row_ids[i])."""
  groups = [g[i:i + rows] for g in group_identical(prompts) for i in range(0, len(g), rows)]
  concurrent = sorted((len(p) + max_new_tokens for p in prompts), reverse=True)[:rows]
  engine = Engine(params, config, max_rows=rows, num_pages=engine_pool_pages(concurrent, page_size),
                  page_size=page_size, chunk_size=chunk_size, tokenizer=tokenizer, eos_ids=eos_ids, lora=lora,
                  lora_scale=lora_scale, dtype=dtype, impl=impl, attention=attention, dense_base=dense_base,
                  mesh=mesh)
  row_ids = list(row_ids)
  seqs = [None] * len(prompts)
  for group in groups:
    requests = [Request(prompts[r], max_new_tokens=max_new_tokens, temperature=sc.temperature,
                        top_k=sc.top_k, top_p=sc.top_p,
                        key=None if rng is None else jax.random.fold_in(rng, row_ids[r]),
                        stop_strings=stop_strings) for r in group]
    for r, seq in zip(group, engine.submit_group(requests)):
      seqs[r] = seq
  engine.run()
  return seqs
