"""Procedural memory: standard operating procedures (SOPs) as JSON files, matched to queries.

File format (one SOP per *.json):
  {"name": str, "description": str, "triggers": "comma, separated, phrases", "category": str,
   "priority": int 1..10, "steps": [{"action": str, "condition": str (optional)}, ...]}
match score = sum over matched triggers of their word count (a trigger matches when all its words occur
in the query) + similarity_weight * cos(e(query), e(name + description + triggers)) when an embedding
function is given; ties go to the higher priority. A SOP is chosen when a trigger matches or the
similarity reaches `min_similarity`.
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

  def text(self) -> str:
    """What the embedding of a SOP is computed from."""
    return f"{self.name}: {self.description} Triggers: {', '.join(self.triggers)}"

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
  unknown = sorted(set(data) - set(_FIELDS))
  if unknown:
    raise SOPError(f"{source}: unknown field {unknown[0]!r} (fields: {', '.join(_FIELDS)})")
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
             data["priority"], tuple(steps), source)


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
  """Holds SOPs (from a folder of *.json or a list) and picks the procedure for a query."""

  def __init__(self, sops: str | pathlib.Path | list[SOP] | None = None,
               embedding_function: Callable[[list[str]], np.ndarray] | None = None,
               similarity_weight: float = 2.0, min_similarity: float = 0.5):
    if sops is None or isinstance(sops, (str, pathlib.Path)):
      folder = pathlib.Path(sops) if sops is not None else default_sop_folder()
      if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: SOP folder not found")
      sops = [load_sop(p) for p in sorted(folder.glob("*.json"))]
    names = [s.name for s in sops]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
      raise SOPError(f"duplicate SOP name {dup!r} in {[s.source for s in sops if s.name == dup]}")
    self.sops = list(sops)
    self.embedding_function = embedding_function
    self.similarity_weight, self.min_similarity = similarity_weight, min_similarity
    self._vectors = None

  def _similarities(self, query: str) -> np.ndarray | None:
    if self.embedding_function is None or not self.sops:
      return None
    if self._vectors is None:
      self._vectors = _unit(np.asarray(self.embedding_function([s.text() for s in self.sops]), np.float32))
    q = _unit(np.asarray(self.embedding_function([query]), np.float32))
    return (self._vectors @ q[0]).astype(np.float64)

  def match(self, query: str, top_k: int = 1) -> list[SOPMatch]:
    """The best `top_k` SOPs for `query` (possibly none), best first."""
    words = set(_WORD.findall(query.lower()))
    sims = self._similarities(query)
    found = []
    for i, sop in enumerate(self.sops):
      hit = tuple(t for t in sop.triggers if set(_WORD.findall(t)) <= words)
      score = float(sum(len(_WORD.findall(t)) for t in hit))
      sim = None if sims is None else float(sims[i])
      if sim is not None:
        score += self.similarity_weight * sim
      if hit or (sim is not None and sim >= self.min_similarity):
        found.append(SOPMatch(sop, score, hit, sim))
    found.sort(key=lambda m: (-m.score, -m.sop.priority, m.sop.name))
    return found[:top_k]

  def build_system_prompt(self, query: str, base: str = "You are a helpful assistant.") -> str:
    """`base`, followed by the chosen procedure when one matches."""
    best = self.match(query)
    if not best:
      return base
    return f"{base}\n\nFollow this procedure step by step:\n{best[0].sop.render()}"


def _unit(v: np.ndarray) -> np.ndarray:
  return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
