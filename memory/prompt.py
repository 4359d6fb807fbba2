"""System prompts for generation: route a query to knowledge (RAG), procedure (SOP), both or neither.

route: "procedure" when the SOP manager matches the query; "knowledge" when the store returns a chunk
with cosine similarity >= min_similarity (from the collection's distance: 1 - d for cosine / ip, 1 - d / 2
for l2, exact for unit-norm embeddings such as MiniLM's); "both" when both hold; "none" otherwise.
The prompt is `base`, then the procedure (numbered steps), then the retrieved context as
`[i] <path> lines a-b (<kind> <name>)` blocks.
"""
from __future__ import annotations

import dataclasses

ROUTES = ("knowledge", "procedure", "both", "none")
DEFAULT_BASE = "You are a helpful assistant for the fineflax project. Answer precisely and say when you are unsure."


@dataclasses.dataclass(frozen=True)
class Plan:
  route: str
  sop: object | None          # memory.sop.SOPMatch
  context: list[dict]         # {"id", "document", "metadata", "similarity"}


def _collection(store, collection: str):
  if store is None or hasattr(store, "query"):
    return store
  return store.get_collection(collection)


def plan(query: str, store=None, sops=None, collection: str = "default", n_results: int = 4,
         min_similarity: float = 0.3, where: dict | None = None, mode: str | None = None) -> Plan:
  """Decides the route and gathers its material. store: a Collection or a VectorStore (uses
  `collection`); sops: a SOPManager. mode forces a route ("knowledge", "procedure", "both", "none")."""
  if mode is not None and mode not in ROUTES:
    raise ValueError(f"mode={mode!r}: choose one of {ROUTES}")
  matches = sops.match(query) if sops is not None else []
  match = matches[0] if matches else None
  context = []
  col = _collection(store, collection)
  if col is not None and col.count():
    res = col.query(query_texts=[query], n_results=n_results, where=where)
    half = getattr(col, "space", "cosine") == "l2"  # squared L2 of unit vectors = 2 - 2 cos
    context = [{"id": i, "document": d, "metadata": m, "similarity": 1.0 - (dist / 2 if half else dist)}
               for i, d, m, dist in zip(res["ids"][0], res["documents"][0], res["metadatas"][0],
                                        res["distances"][0])]
  if mode is None:
    relevant = [c for c in context if c["similarity"] >= min_similarity]
    mode = {(True, True): "both", (True, False): "knowledge", (False, True): "procedure",
            (False, False): "none"}[(bool(relevant), match is not None)]
    context = relevant
  if mode in ("procedure", "none"):
    context = []
  if mode in ("knowledge", "none"):
    match = None
  return Plan(mode, match, context)


def render(plan_: Plan, base: str = DEFAULT_BASE) -> str:
  parts = [base]
  if plan_.sop is not None:
    parts.append("Follow this procedure step by step:\n" + plan_.sop.sop.render())
  if plan_.context:
    blocks = []
    for i, c in enumerate(plan_.context, 1):
      m = c["metadata"] or {}
      where = f"{m.get('path', c['id'])}" + (f" lines {m['start_line']}-{m['end_line']}" if "start_line" in m else "")
      about = " ".join(x for x in (m.get("kind", ""), m.get("name", "")) if x)
      blocks.append(f"[{i}] {where}" + (f" ({about})" if about else "") + f"\n{c['document']}")
    parts.append("Use this context when it is relevant; cite it as [i]:\n\n" + "\n\n".join(blocks))
  return "\n\n".join(parts)


def build_system_prompt(query: str, store=None, sops=None, collection: str = "default", n_results: int = 4,
                        min_similarity: float = 0.3, where: dict | None = None, mode: str | None = None,
                        base: str = DEFAULT_BASE) -> str:
  """The system prompt for `query` (see module docstring)."""
  return render(plan(query, store, sops, collection, n_results, min_similarity, where, mode), base)
