"""RAG variants, retrievers, categories and priors, declared in a JSON file or on the command line.

Config file (JSON; every section optional but "variants"):

  {"retrievers": {NAME: {"kind": "bm25" | "vector" | "hybrid", "corpus": "kb.jsonl",
                         "embedder"?: "all-MiniLM-L6-v2", "reranker"?: CROSS_ENCODER_DIR, "rerank_pool"?: 20,
                         "fusion"?: "rrf" | "convex"}
                 | {"url": "http://HOST:PORT/retrieve"}
                 | {"store": STORE_DIR, "collection": "default"}},
   "variants": {NAME: {"kind": "no_rag" | "naive_rag" | "hybrid_rag" | "agentic_rag", "retriever"?: NAME,
                       "generator"?: SERVED_MODEL, "k"?: 3, "prompt"?: "... {passages} ...",
                       "max_turns"?: 3, "max_turn_tokens"?: 64}},
   "categories": {CATEGORY: [REGEX, ...]},
   "priors": {VARIANT: {"n"?: N0, "mean"?: M0, "by_category"?: {CATEGORY: {"n": N0, "mean": M0}}}}}

A relative corpus / store / reranker path is relative to the config file. On the command line the same
entries are `NAME:key=value,key=value` (`--retriever dense:kind=vector,corpus=kb.jsonl`,
`--rag naive_rag:retriever=dense,k=3`); a variant whose name is a kind needs no `kind=`. Kinds:
  no_rag       the generator alone (its prompt, if set, as the system message; no {passages} needed)
  naive_rag    one retrieval of the question, the passages in the system prompt, one generation
  hybrid_rag   the same over a "hybrid" retriever (BM25 + dense, fused, optionally cross-encoder reranked)
  agentic_rag  the Search-R1 loop (`fineflax.search_r1.rollout.run_rollouts`): the model searches as it decides
Every mistake raises RagConfigError naming the file or flag, the field and the value: one line.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re

KINDS = ("no_rag", "naive_rag", "hybrid_rag", "agentic_rag")
RETRIEVER_KINDS = ("bm25", "vector", "hybrid")
DEFAULT_PROMPT = ("Answer the question with the passages below. Reply with the answer only, in a few words."
                  "\n\n{passages}")
_INT_FIELDS = ("k", "max_turns", "max_turn_tokens", "rerank_pool")
_VARIANT_FIELDS = ("kind", "retriever", "generator", "k", "prompt", "max_turns", "max_turn_tokens")
_RETRIEVER_FIELDS = ("kind", "corpus", "embedder", "reranker", "rerank_pool", "fusion", "url", "store",
                     "collection")


class RagConfigError(ValueError):
  """A bad RAG declaration; the message names where (file / flag), the field and the value."""


@dataclasses.dataclass(frozen=True)
class RagVariant:
  name: str
  kind: str
  retriever: str | None = None
  generator: str | None = None  # a served model or adapter name; None: the base
  k: int = 3
  prompt: str | None = None  # system prompt; {passages} is replaced by the retrieved passages
  max_turns: int = 3
  max_turn_tokens: int = 64

  @property
  def retrieves(self) -> bool:
    return self.kind != "no_rag"


@dataclasses.dataclass
class RagConfig:
  variants: dict[str, RagVariant] = dataclasses.field(default_factory=dict)
  retrievers: dict[str, dict] = dataclasses.field(default_factory=dict)
  categories: dict[str, list[str]] = dataclasses.field(default_factory=dict)
  priors: dict[str, dict] = dataclasses.field(default_factory=dict)

  def merge(self, other: "RagConfig", where: str) -> "RagConfig":
    for section in ("variants", "retrievers", "categories", "priors"):
      mine, theirs = getattr(self, section), getattr(other, section)
      clash = sorted(set(mine) & set(theirs))
      if clash:
        raise RagConfigError(f"{where}: {section} {clash} declared twice")
      mine.update(theirs)
    return self


def parse_entry(text: str, flag: str) -> tuple[str, dict]:
  """`NAME:key=value,key=value` -> (NAME, {key: value}); integer fields parsed."""
  name, _, rest = text.partition(":")
  if not name.strip():
    raise RagConfigError(f"{flag} {text!r}: expected NAME:key=value,...")
  fields = {}
  for part in filter(None, (p.strip() for p in rest.split(","))):
    key, eq, value = part.partition("=")
    if not eq or not key.strip():
      raise RagConfigError(f"{flag} {text!r}: {part!r} is not key=value")
    fields[key.strip()] = value.strip()
  return name.strip(), fields


def _int(value, where: str, lo: int = 1) -> int:
  try:
    out = int(value)
  except (TypeError, ValueError):
    raise RagConfigError(f"{where}={value!r}: expected an integer") from None
  if isinstance(value, bool) or isinstance(value, float) or out < lo:
    raise RagConfigError(f"{where}={value!r}: expected an integer >= {lo}")
  return out


def variant_from(name: str, fields: dict, where: str) -> RagVariant:
  if not isinstance(fields, dict):
    raise RagConfigError(f"{where}: expected an object of fields, got {type(fields).__name__}")
  unknown = sorted(set(fields) - set(_VARIANT_FIELDS))
  if unknown:
    raise RagConfigError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(_VARIANT_FIELDS)})")
  kind = fields.get("kind", name if name in KINDS else None)
  if kind not in KINDS:
    raise RagConfigError(f"{where}.kind={kind!r}: choose one of {', '.join(KINDS)}")
  out = {k: v for k, v in fields.items() if k != "kind"}
  for key in ("k", "max_turns", "max_turn_tokens"):
    if key in out:
      out[key] = _int(out[key], f"{where}.{key}", lo=0 if key == "max_turns" else 1)
  if kind != "no_rag" and not out.get("retriever"):
    raise RagConfigError(f"{where}: a {kind} variant needs retriever=NAME")
  prompt = out.get("prompt")
  if prompt is not None and kind in ("naive_rag", "hybrid_rag") and "{passages}" not in prompt:
    raise RagConfigError(f"{where}.prompt={prompt[:60]!r}: needs {{passages}} where the passages go")
  return RagVariant(name, kind, **out)


def retriever_from(name: str, fields: dict, where: str, base: pathlib.Path | None) -> dict:
  if not isinstance(fields, dict):
    raise RagConfigError(f"{where}: expected an object of fields, got {type(fields).__name__}")
  unknown = sorted(set(fields) - set(_RETRIEVER_FIELDS))
  if unknown:
    raise RagConfigError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(_RETRIEVER_FIELDS)})")
  spec = dict(fields)
  sources = [k for k in ("corpus", "url", "store") if spec.get(k)]
  if len(sources) != 1:
    raise RagConfigError(f"{where}: give exactly one of corpus=FILE, url=URL, store=DIR (got {sources or 'none'})")
  if "corpus" in spec and spec.get("kind") not in RETRIEVER_KINDS:
    raise RagConfigError(f"{where}.kind={spec.get('kind')!r}: a corpus retriever needs kind "
                         f"{' | '.join(RETRIEVER_KINDS)}")
  if "url" in spec and not str(spec["url"]).startswith(("http://", "https://")):
    raise RagConfigError(f"{where}.url={spec['url']!r}: expected an http(s) URL of a /retrieve endpoint")
  if "rerank_pool" in spec:
    spec["rerank_pool"] = _int(spec["rerank_pool"], f"{where}.rerank_pool")
  for key in ("corpus", "store", "reranker"):
    if spec.get(key) and base is not None and not pathlib.Path(spec[key]).is_absolute():
      spec[key] = str(base / spec[key])
  for key in ("corpus", "store"):
    if spec.get(key) and not pathlib.Path(spec[key]).exists():
      raise RagConfigError(f"{where}.{key}={spec[key]!r}: no such file or folder")
  return spec


def _priors(priors, where: str, variants) -> dict:
  if not isinstance(priors, dict):
    raise RagConfigError(f"{where}: expected an object {{variant: {{n, mean, by_category}}}}")
  out = {}
  for v, p in priors.items():
    at = f"{where}.{v}"
    if v not in variants:
      raise RagConfigError(f"{at}: unknown variant {v!r} (variants: {', '.join(variants)})")
    if not isinstance(p, dict) or not set(p) <= {"n", "mean", "by_category"}:
      raise RagConfigError(f"{at}: expected {{n, mean, by_category}}, got {p!r:.80}")
    entries = [(at, p)] if "n" in p or "mean" in p else []
    entries += [(f"{at}.by_category.{c}", q) for c, q in (p.get("by_category") or {}).items()]
    for where_p, q in entries:
      if not isinstance(q, dict) or "n" not in q or "mean" not in q:
        raise RagConfigError(f"{where_p}: expected {{\"n\": pseudo-count, \"mean\": prior mean}}, got {q!r:.80}")
      _int(q["n"], f"{where_p}.n", lo=0)
      m = q["mean"]
      if isinstance(m, bool) or not isinstance(m, (int, float)) or not -1e9 <= m <= 1e9:
        raise RagConfigError(f"{where_p}.mean={m!r}: expected a finite number")
    out[v] = p
  return out


def load_config(path) -> RagConfig:
  """The RagConfig of a JSON file (module docstring)."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise RagConfigError(f"{path}: no such RAG config file")
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise RagConfigError(f"{path}: invalid JSON ({e})") from None
  if not isinstance(data, dict):
    raise RagConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
  unknown = sorted(set(data) - {"retrievers", "variants", "categories", "priors"})
  if unknown:
    raise RagConfigError(f"{path}: unknown section {unknown[0]!r} (sections: retrievers, variants, categories, "
                         "priors)")
  for section in ("retrievers", "variants", "categories", "priors"):
    if not isinstance(data.get(section, {}), dict):
      raise RagConfigError(f"{path}: {section}: expected an object, got {type(data[section]).__name__}")
  config = RagConfig(
      variants={n: variant_from(n, f, f"{path}: variants.{n}") for n, f in data.get("variants", {}).items()},
      retrievers={n: retriever_from(n, f, f"{path}: retrievers.{n}", path.parent)
                  for n, f in data.get("retrievers", {}).items()})
  config.categories = categories_from(data.get("categories", {}), f"{path}: categories")
  config.priors = _priors(data.get("priors", {}), f"{path}: priors", config.variants)
  return config


def categories_from(cats: dict, where: str) -> dict[str, list[str]]:
  out = {}
  for c, patterns in cats.items():
    if isinstance(patterns, str):
      patterns = [patterns]
    if not isinstance(patterns, list) or not patterns:
      raise RagConfigError(f"{where}.{c}: expected a list of regular expressions")
    for p in patterns:
      try:
        re.compile(p)
      except (re.error, TypeError) as e:
        raise RagConfigError(f"{where}.{c}: {p!r} is not a regular expression ({e})") from None
    out[c] = list(patterns)
  return out


def from_args(config_path=None, rag: list[str] = (), retrievers: list[str] = ()) -> RagConfig:
  """The config file (if any) plus `--retriever` and `--rag` entries; checks that every variant's retriever
  is declared and a hybrid_rag variant's retriever is of kind "hybrid"."""
  config = load_config(config_path) if config_path else RagConfig()
  extra = RagConfig(retrievers={n: retriever_from(n, f, f"--retriever {n}", None)
                                for n, f in (parse_entry(t, "--retriever") for t in retrievers)},
                    variants={n: variant_from(n, f, f"--rag {n}")
                              for n, f in (parse_entry(t, "--rag") for t in rag)})
  config.merge(extra, "--rag / --retriever")
  for v in config.variants.values():
    if v.retriever is not None and v.retriever not in config.retrievers:
      raise RagConfigError(f"variant {v.name}: retriever={v.retriever!r} is not declared (retrievers: "
                           f"{', '.join(config.retrievers) or 'none'})")
    if v.kind == "hybrid_rag" and config.retrievers[v.retriever].get("kind") != "hybrid":
      raise RagConfigError(f"variant {v.name}: a hybrid_rag variant needs a retriever of kind hybrid; "
                           f"{v.retriever!r} is {config.retrievers[v.retriever].get('kind') or 'remote'}")
  return config
