"""The search tool of a rollout: one batched call per turn, in-process engine or HTTP retrieval server.

A search function maps queries [Q] to passages [Q][<= topk]. `make_search_fn` wraps
- an engine with `search_batch(queries, k) -> [[Hit]]` (`retrieval.create_search_engine`), or
- a URL of a Search-R1 /retrieve server (`retrieval.server`; contents "\\"Title\\"\\ntext"), or
- any callable (queries, topk) -> [[Passage | Hit | Search-R1 document dict]].
With `timeout_s`, a call that takes longer raises `SearchTimeout` (the worker thread is abandoned).
"""
from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Sequence

from fineflax.search_r1.actions import Passage

SearchFn = Callable[[Sequence[str]], list[list[Passage]]]


class SearchTimeout(TimeoutError):
  pass


def to_passage(item: Any) -> Passage:
  """A Passage from a Passage, a retrieval Hit (title, text), or a Search-R1 result / document dict."""
  if isinstance(item, Passage):
    return item
  if isinstance(item, dict):
    doc = item.get("document", item)
    if "contents" in doc:  # Search-R1: first line is the (quoted) title, the rest the text
      title, _, text = str(doc["contents"]).partition("\n")
      return Passage(title.strip().strip('"'), text)
    if "text" in doc:
      return Passage(str(doc.get("title", "")), str(doc["text"]))
  elif hasattr(item, "text"):
    return Passage(str(getattr(item, "title", "")), str(item.text))
  raise TypeError(f"cannot read a passage from {type(item).__name__}: {item!r:.120}")


def make_search_fn(tool, topk: int = 3, timeout_s: float | None = None) -> SearchFn:
  """A SearchFn over `tool` (engine, "http://…/retrieve" URL or callable(queries, topk)); see module doc."""
  if topk < 1:
    raise ValueError(f"topk={topk}: must be >= 1")
  if isinstance(tool, str):
    if not tool.startswith(("http://", "https://")):
      raise ValueError(f"search tool {tool!r}: a string must be an http(s) URL of a /retrieve endpoint")
    from retrieval.server import retrieve_http
    call = lambda queries: retrieve_http(tool, queries, topk=topk, timeout=timeout_s or 60.0)
  elif hasattr(tool, "search_batch"):
    call = lambda queries: tool.search_batch(list(queries), topk)
  elif callable(tool):
    call = lambda queries: tool(list(queries), topk)
  else:
    raise TypeError(f"search tool of type {type(tool).__name__}: need an engine with search_batch, a URL "
                    "or a callable")

  def search(queries: Sequence[str]) -> list[list[Passage]]:
    queries = list(queries)
    if not queries:
      return []
    if timeout_s is None:
      results = call(queries)
    else:
      pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="search")
      try:
        results = pool.submit(call, queries).result(timeout=timeout_s)
      except concurrent.futures.TimeoutError:
        raise SearchTimeout(f"no answer within {timeout_s:g} s") from None
      finally:
        pool.shutdown(wait=False)
    if len(results) != len(queries):
      raise RuntimeError(f"search returned {len(results)} result lists for {len(queries)} queries")
    return [[to_passage(x) for x in row][:topk] for row in results]

  return search
