"""What a RAG variant does with one question, apart from generating: retrieve, build the generator's
messages, or run the Search-R1 loop over an LLM client.

  naive_rag / hybrid_rag: hits = retriever.search_batch([question], k)[0]; the generator answers
      [system: prompt with {passages} = "Doc 1(Title: t) text\\n..." (Search-R1's format)] + the request's
      messages (a request system message follows ours in the same system message)
  no_rag: the request's messages (the variant's prompt, if any, as the system message)
  agentic_rag: `run_rollouts(LLMPolicy(llm), ...)`, the one Search-R1 loop: every search is
      retriever.search_batch(queries, k); its answer is the final <answer> (else the last turn's text), its
      passages every distinct passage its searches returned (first-seen order), and the input it is
      credited with (for training rows) is the naive prompt over those passages.
The question is the last user message.
"""
from __future__ import annotations

import dataclasses

from fineflax.rag.retrievers import passage_record
from fineflax.rag.spec import DEFAULT_PROMPT, RagVariant
from fineflax.search_r1.actions import format_passages
from fineflax.search_r1.policy import LLMPolicy
from fineflax.search_r1.rollout import RolloutConfig, RolloutResult, prompt_ids, run_rollouts


@dataclasses.dataclass
class AgenticAnswer:
  answer: str
  passages: list[dict]
  input: list[dict]
  rollout: RolloutResult
  prompt_tokens: int


def question_of(messages: list[dict]) -> str:
  """The content of the last user message ("" when there is none)."""
  return next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")


def retrieve(variant: RagVariant, retriever, question: str) -> list:
  """The variant's passages for `question` (hits, best first); [] for no_rag."""
  if not variant.retrieves:
    return []
  return retriever.search_batch([question], variant.k)[0]


def context_messages(variant: RagVariant, messages: list[dict], hits) -> list[dict]:
  """The messages the generator answers from (module docstring)."""
  if variant.kind == "no_rag":
    system = variant.prompt
  else:
    system = (variant.prompt or DEFAULT_PROMPT).replace("{passages}", format_passages(hits).strip())
  if system is None:
    return list(messages)
  own = [m["content"] for m in messages if m["role"] == "system"]
  return ([{"role": "system", "content": "\n\n".join([system, *own])}]
          + [m for m in messages if m["role"] != "system"])


def run_agentic(variant: RagVariant, retriever, question: str, llm, tokenizer, *, temperature: float = 0.0,
                max_response_tokens: int = 512) -> AgenticAnswer:
  """One Search-R1 rollout of `question` with `llm` (anything with token-level `complete`)."""
  config = RolloutConfig(max_turns=variant.max_turns, max_turn_tokens=variant.max_turn_tokens,
                         max_response_tokens=max_response_tokens)
  seen: dict[str, object] = {}

  def search(queries):
    results = retriever.search_batch(list(queries), variant.k)
    for hits in results:
      for h in hits:
        seen.setdefault(str(h.id), h)
    return results

  prompt = prompt_ids(tokenizer, question, config)
  (row,) = run_rollouts(LLMPolicy(llm, tokenizer, temperature), [prompt], search, tokenizer, config)
  hits = list(seen.values())
  answer = row.answer if row.answer is not None else (row.turn_texts[-1].strip() if row.turn_texts else "")
  naive = dataclasses.replace(variant, kind="naive_rag", prompt=None)
  return AgenticAnswer(answer, [passage_record(h) for h in hits],
                       context_messages(naive, [{"role": "user", "content": question}], hits), row, len(prompt))
