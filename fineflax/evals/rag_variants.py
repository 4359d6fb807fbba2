"""RAG variants as eval variants, run in-process: a `fineflax.rag` variant (declared in a RAG config file)
over a local generator (SOURCE[+ADAPTER], `variants.load_local`).

  naive / hybrid / no RAG: retrieve (`fineflax.rag.agents.retrieve`), then the generator answers the context
      messages (`context_messages`) with `fineflax.sampling.generate`, greedy unless a temperature is set
  agentic: the Search-R1 loop (`run_agentic`) with `GenerateLLM`, one `generate` call per model turn
The retrievers are built once per config (`fineflax.rag.retrievers.build_retriever`).
"""
from __future__ import annotations

import types

from fineflax.rag.agents import context_messages, question_of, retrieve, run_agentic
from fineflax.rag.retrievers import build_retriever


class GenerateLLM:
  """`complete(token ids, max_tokens=, stop=, temperature=)` on `fineflax.sampling.generate` (token level,
  what `LLMPolicy` asks of an LLM)."""

  def __init__(self, params, config, tokenizer, lora, scale, dtype, seed: int = 0):
    self.params, self.config, self.tok, self.lora, self.scale, self.dtype = params, config, tokenizer, lora, scale, dtype
    self.seed, self.calls = seed, 0

  def complete(self, prompt, max_tokens=64, stop=(), temperature=0.0):
    import jax
    from fineflax.sampling import generate
    self.calls += 1
    out = generate(self.params, self.config, [list(prompt)], max_new_tokens=int(max_tokens),
                   temperature=float(temperature or 0.0), stop_strings=tuple(stop or ()), tokenizer=self.tok,
                   lora=self.lora, lora_scale=self.scale, dtype=self.dtype,
                   rng=jax.random.PRNGKey(self.seed + self.calls))
    n = int(out.lengths[0])
    ids, lps = out.tokens[0, :n].tolist(), out.raw_logprobs[0, :n].tolist()
    return types.SimpleNamespace(response_ids=ids, logprobs=lps, raw_logprobs=lps,
                                 finish_reason=out.finish_reason[0])


def rag_variant(variant, retriever, loaded, *, max_tokens: int = 256, temperature: float = 0.0, seed: int = 0,
                batch_size: int = 16):
  """An eval Variant (messages lists -> answers) of the RAG `variant` over a generator `loaded` by
  `variants.load_local` (params, config, tokenizer, lora, scale, dtype)."""
  params, config, tok, lora, scale, dtype = loaded
  llm = GenerateLLM(params, config, tok, lora, scale, dtype, seed)

  def run(prompts):
    from fineflax.evals.variants import generate_answers
    if variant.kind == "agentic_rag":
      return [run_agentic(variant, retriever, question_of(m), llm, tok, temperature=temperature).answer
              for m in prompts]
    msgs = [context_messages(variant, m, retrieve(variant, retriever, question_of(m))) for m in prompts]
    return generate_answers(loaded, msgs, max_tokens=max_tokens, temperature=temperature, batch_size=batch_size,
                            seed=seed)
  return run


def rag_variants(config, names, generator: str, *, quant: str = "none", **kw) -> dict:
  """{name: Variant} for the named variants of a `fineflax.rag.spec.RagConfig` (their own "generator"
  field, a local SOURCE[+ADAPTER], wins over `generator`); each generator and retriever is loaded once."""
  from fineflax.evals.variants import load_local
  retrievers, loaded, out = {}, {}, {}
  for name in names:
    v = config.variants[name]
    if v.retriever and v.retriever not in retrievers:
      retrievers[v.retriever] = build_retriever(config.retrievers[v.retriever])
    gen = v.generator or generator
    if gen not in loaded:
      source, _, adapter = gen.partition("+")
      loaded[gen] = load_local(source, adapter or None, quant=quant)
    out[name] = rag_variant(v, retrievers.get(v.retriever), loaded[gen], **kw)
  return out
