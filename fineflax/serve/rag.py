"""RAG variants in the server: their retrievers, the category of a request, and the engine as an LLM client
for the agentic loop.

  RagRuntime.build(config)   retrievers built once (`fineflax.rag.retrievers.build_retriever`), the rule
                             classifier of the config's categories (`fineflax.rag.categories`)
  EngineLLM(engine, adapter) `llm.complete(token ids, max_tokens=, stop=, temperature=)` as one engine Job
                             (blocking: call it from a worker thread); token ids and raw log-probs from the
                             job's delta events, so `LLMPolicy` runs the Search-R1 loop on the served model

Retrieval and the agentic loop run on worker threads (`run_in_threadpool`), never on the event loop: the
requests of other clients keep flowing while one retrieves (see `fineflax.serve.app`).
"""
from __future__ import annotations

import threading

from fineflax.agents.llm import LLM, Completion
from fineflax.rag.categories import RuleClassifier
from fineflax.rag.retrievers import build_retriever
from fineflax.rag.spec import RagConfig
from fineflax.serve.engine import Job


class EngineLLM(LLM):
  """The server's engine (`fineflax.serve.engine.Engine`) with one adapter (None: the base), greedy unless
  a call sets a temperature."""

  def __init__(self, engine, adapter: str | None = None, temperature: float = 0.0, seed: int | None = 0,
               name: str = "fineflax-serve"):
    super().__init__()
    self.engine, self.adapter, self.temperature, self.seed, self.name = engine, adapter, temperature, seed, name

  def _complete(self, prompt, max_tokens=None, temperature=None, stop=()):
    if isinstance(prompt, str):
      prompt = self.engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = [int(t) for t in prompt]
    done, out = threading.Event(), {"text": "", "entries": [], "reason": None, "error": None}

    def emit(ev):
      if ev[0] == "delta":
        out["text"] += ev[2]
        out["entries"] += ev[3]
      elif ev[0] == "error":
        out["error"] = ev[1]
        done.set()
      else:  # ("done", index, finish reason, tokens)
        out["reason"] = ev[2]
        done.set()
    job = Job(prompt=ids, emit=emit, max_tokens=int(max_tokens or 64), stop=tuple(stop or ()),
              temperature=float(self.temperature if temperature is None else temperature), seed=self.seed,
              adapter=self.adapter)
    self.engine.submit(job)
    done.wait()
    if out["error"]:
      raise RuntimeError(out["error"])
    tokens = [int(t) for t, _ in out["entries"]]
    logprobs = [float(lp) for _, lp in out["entries"]]
    return Completion(out["text"], ids, tokens, logprobs, logprobs, out["reason"], self.name)


class RagRuntime:
  """The RAG variants of a server: config, built retrievers and the category classifier."""

  def __init__(self, config: RagConfig, retrievers: dict, classifier=None):
    self.config, self.variants, self.retrievers = config, config.variants, retrievers
    self.classifier = classifier

  @classmethod
  def build(cls, config: RagConfig, embedder=None) -> "RagRuntime":
    used = {v.retriever for v in config.variants.values() if v.retriever}
    retrievers = {name: build_retriever(config.retrievers[name], embedder=embedder) for name in sorted(used)}
    classifier = RuleClassifier(config.categories) if config.categories else None
    return cls(config, retrievers, classifier)

  def category(self, given: str | None, question: str) -> str | None:
    """The request's category, else the classifier's (None without either)."""
    if given is not None or self.classifier is None:
      return given
    return self.classifier(question)
