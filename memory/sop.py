"""Procedural memory: standard operating procedures (SOPs) as JSON files, matched to queries.

File format (one SOP per *.json):
  {"name": str, "description": str, "triggers": "comma, separated, phrases", "category": str,
   "priority": int 1..10, "steps": [{"action": str, "condition": str (optional)}, ...],
   "examples": [str, ...] (optional: requests this procedure is for)}
Routing (SOPManager.match):
  - with an embedding function: similarity(query, SOP) = max cosine between e(query) and e(t) over the SOP's
    texts t (name + description + triggers, and each example). SOPs whose similarity reaches
    `min_similarity` are returned, most similar first. For all-MiniLM-L6-v2 the default threshold is
    MINILM_MIN_SIMILARITY, calibrated on memory/sops_eval/calibration.jsonl (python -m memory.sop_calibration).
  - fallback (no embedding function, or no SOP reaches the threshold): trigger matching. score = sum over
    matched triggers of their word count (a trigger matches when all its words occur in the query); ties go
    to the higher priority.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Callable

import numpy as np

_WORD = re.compile(r"[a-z0-9]+")
_FIELDS = {"name": str, "description": str, "triggers": str, "category": str, "priority": int, "steps": list}
_OPTIONAL = {"examples": list}
MINILM_MIN_SIMILARITY = 0.328  # calibrated (memory.sop_calibration): threshold 0.3277, calibration off-topic max 0.3198
DEFAULT_MIN_SIMILARITY = 0.5


class SOPError(ValueError):
  """A SOP file that does not follow the format; the message names the file and field."""


@dataclasses.dataclass(frozen=True)
class Step:
  action: str
  condition: str | None = None


@dataclasses.dataclass(frozen=True)
class SOP:
  name: str
  description: str
  triggers: tuple[str, ...]
  category: str
  priority: int
  steps: tuple[Step, ...]
  source: str = ""
  examples: tuple[str, ...] = ()

  def text(self) -> str:
    """The SOP's summary text (one of the texts its similarity is computed from)."""
    return f"{self.name}: {self.description} Triggers: {', '.join(self.triggers)}"

  def texts(self) -> list[str]:
    """Every text a query is compared with: the summary and each example request."""
    return [self.text(), *self.examples]

  def render(self) -> str:
    """The procedure as numbered steps for a system prompt."""
    lines = [f"Procedure: {self.name} — {self.description}"]
    for i, step in enumerate(self.steps, 1):
      lines.append(f"{i}. " + (f"If {step.condition}: " if step.condition else "") + step.action)
    return "\n".join(lines)


def parse_sop(data, source: str = "<dict>") -> SOP:
  """A validated SOP; SOPError naming `source` and the faulty field otherwise."""
  if not isinstance(data, dict):
    raise SOPError(f"{source}: expected a JSON object, got {type(data).__name__}")
  unknown = sorted(set(data) - set(_FIELDS) - set(_OPTIONAL))
  if unknown:
    raise SOPError(f"{source}: unknown field {unknown[0]!r} (fields: {', '.join([*_FIELDS, *_OPTIONAL])})")
  examples = data.get("examples", [])
  if not isinstance(examples, list) or any(not isinstance(e, str) or not e.strip() for e in examples):
    raise SOPError(f"{source}: field 'examples' = {examples!r} must be a list of non-empty strings")
  for field, kind in _FIELDS.items():
    if field not in data:
      raise SOPError(f"{source}: missing field {field!r}")
    value = data[field]
    if not isinstance(value, kind) or isinstance(value, bool):
      raise SOPError(f"{source}: field {field!r} = {value!r} must be {kind.__name__}")
    if kind is str and not value.strip():
      raise SOPError(f"{source}: field {field!r} is empty")
  if not 1 <= data["priority"] <= 10:
    raise SOPError(f"{source}: field 'priority' = {data['priority']} must be in 1..10")
  triggers = tuple(t.strip().lower() for t in data["triggers"].split(","))
  if any(not _WORD.search(t) for t in triggers):
    raise SOPError(f"{source}: field 'triggers' = {data['triggers']!r} has an empty trigger")
  if not data["steps"]:
    raise SOPError(f"{source}: field 'steps' is empty")
  steps = []
  for i, step in enumerate(data["steps"]):
    at = f"{source}: field 'steps[{i}]'"
    if not isinstance(step, dict):
      raise SOPError(f"{at} must be an object with 'action' (and optional 'condition')")
    extra = sorted(set(step) - {"action", "condition"})
    if extra:
      raise SOPError(f"{at} has unknown key {extra[0]!r}")
    if not isinstance(step.get("action"), str) or not step["action"].strip():
      raise SOPError(f"{at}.action must be a non-empty string, got {step.get('action')!r}")
    if "condition" in step and (not isinstance(step["condition"], str) or not step["condition"].strip()):
      raise SOPError(f"{at}.condition must be a non-empty string, got {step['condition']!r}")
    steps.append(Step(step["action"].strip(), step.get("condition")))
  return SOP(data["name"].strip(), data["description"].strip(), triggers, data["category"].strip(),
             data["priority"], tuple(steps), source, tuple(e.strip() for e in examples))


def load_sop(path: str | pathlib.Path) -> SOP:
  path = pathlib.Path(path)
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise SOPError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
  return parse_sop(data, str(path))


@dataclasses.dataclass(frozen=True)
class SOPMatch:
  sop: SOP
  score: float
  matched_triggers: tuple[str, ...]
  similarity: float | None = None


def default_sop_folder() -> pathlib.Path:
  return pathlib.Path(__file__).with_name("sops")


class SOPManager:
  """Holds SOPs (from a folder of *.json or a list) and picks the procedure for a query.

  embedding_function: texts -> [N, d] (None: triggers only; "default": all-MiniLM-L6-v2 through
  memory.store.default_embedding_function). min_similarity: None picks MINILM_MIN_SIMILARITY for
  all-MiniLM-L6-v2, DEFAULT_MIN_SIMILARITY otherwise."""

  def __init__(self, sops: str | pathlib.Path | list[SOP] | None = None,
               embedding_function: Callable[[list[str]], np.ndarray] | str | None = None,
               min_similarity: float | None = None):
    if sops is None or isinstance(sops, (str, pathlib.Path)):
      folder = pathlib.Path(sops) if sops is not None else default_sop_folder()
      if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: SOP folder not found")
      sops = [load_sop(p) for p in sorted(folder.glob("*.json"))]
    names = [s.name for s in sops]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
      raise SOPError(f"duplicate SOP name {dup!r} in {[s.source for s in sops if s.name == dup]}")
    if embedding_function == "default":
      from memory.store import default_embedding_function
      embedding_function = default_embedding_function()
    self.sops = list(sops)
    self.embedding_function = embedding_function
    if min_similarity is None:
      minilm = getattr(embedding_function, "name", "") == "all-MiniLM-L6-v2"
      min_similarity = MINILM_MIN_SIMILARITY if minilm else DEFAULT_MIN_SIMILARITY
    self.min_similarity = min_similarity
    self._vectors = None
    self._owner = None

  def similarities(self, queries: list[str]) -> np.ndarray | None:
    """[len(queries), len(sops)]: max cosine between each query and each SOP's texts; None without an
    embedding function."""
    if self.embedding_function is None or not self.sops:
      return None
    if self._vectors is None:
      texts = [t for s in self.sops for t in s.texts()]
      self._owner = np.array([i for i, s in enumerate(self.sops) for _ in s.texts()])
      self._vectors = _unit(np.asarray(self.embedding_function(texts), np.float32))
    q = _unit(np.asarray(self.embedding_function(list(queries)), np.float32))
    per_text = (q @ self._vectors.T).astype(np.float64)
    out = np.full((len(queries), len(self.sops)), -np.inf)
    np.maximum.at(out.T, self._owner, per_text.T)
    return out

  def match(self, query: str, top_k: int = 1) -> list[SOPMatch]:
    """The best `top_k` SOPs for `query` (possibly none), best first: by similarity when one reaches
    min_similarity, else by triggers."""
    words = set(_WORD.findall(query.lower()))
    sims = self.similarities([query])
    sims = None if sims is None else sims[0]
    found = []
    for i, sop in enumerate(self.sops):
      hit = tuple(t for t in sop.triggers if set(_WORD.findall(t)) <= words)
      sim = None if sims is None else float(sims[i])
      found.append(SOPMatch(sop, float(sum(len(_WORD.findall(t)) for t in hit)), hit, sim))
    similar = [m for m in found if m.similarity is not None and m.similarity >= self.min_similarity]
    if similar:
      similar.sort(key=lambda m: (-m.similarity, -m.sop.priority, m.sop.name))
      return similar[:top_k]
    triggered = [m for m in found if m.matched_triggers]
    triggered.sort(key=lambda m: (-m.score, -m.sop.priority, m.sop.name))
    return triggered[:top_k]

  def build_system_prompt(self, query: str, base: str = "You are a helpful assistant.") -> str:
    """`base`, followed by the chosen procedure when one matches."""
    best = self.match(query)
    if not best:
      return base
    return f"{base}\n\nFollow this procedure step by step:\n{best[0].sop.render()}"


def _unit(v: np.ndarray) -> np.ndarray:
  return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
