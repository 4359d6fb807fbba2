"""Automatic prompt optimisation (APO): beam search over a prompt-template resource with textual gradients,
following Agent Lightning's `agentlightning.algorithm.apo.APO` (same parameter names).

  beam = [seed prompt]
  for round in 1..beam_rounds:
    parents = beam_width prompts sampled from the beam (the beam repeated when it is smaller)
    for each parent, branch_factor times:
      run the agent with the parent on a train batch of gradient_batch_size tasks; the critic LLM reads the
      failing rollouts (reward < success_reward; all of them when none fails), rendered from their spans
      (model turns, tool calls and results, reward), and writes a critique (the textual gradient); the
      editor LLM rewrites the parent along it -> a child candidate (parent id, round, critique)
    candidates = beam + children, each scored on the round's validation batch (val_batch_size tasks; mean
    reward); beam = the best beam_width (ties: earlier candidate first)
    the beam leader is scored on the whole validation set; it becomes the best prompt when it beats the best
  the best prompt is saved as a new version of the resource (meta: its score, id and every candidate).
Every candidate is logged (id, parent, round, prompt, critique, every score it got) in `APOResult.candidates`
and as a version of the store resource "<resource>:candidates".
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Sequence

import numpy as np

from fineflax.agents.runner import RolloutRecord, run_rollouts

CRITIC_PROMPT = (
    "You optimize the system prompt of an LLM agent.\n\n## Prompt\n{prompt}\n\n## Experiments with this prompt\n"
    "{experiments}\n\n## Your task\nGive a brief critique listing specific causes of the failures and concrete, "
    "testable changes to the prompt (format, constraints, ordering, definitions) that would raise the reward.")
EDITOR_PROMPT = (
    "Revise the prompt using the critique as constraints and improvement guide. Define what to do, then how. "
    "Return only the improved prompt between <prompt> and </prompt>.\n\n## Prompt\n{prompt}\n\n## Critique\n{critique}")


@dataclasses.dataclass
class APOSettings:
  val_batch_size: int = 16  # validation tasks scoring each round's candidates
  gradient_batch_size: int = 4  # train rollouts behind each critique
  beam_width: int = 4  # prompts kept after each round
  branch_factor: int = 4  # children per parent
  beam_rounds: int = 3  # rounds of expansion and selection
  success_reward: float = 1.0  # a rollout with a lower reward is a failure the critic sees
  max_trace_chars: int = 1500  # characters of each rendered rollout shown to the critic
  seed: int = 0

  def __post_init__(self):
    for k in ("val_batch_size", "gradient_batch_size", "beam_width", "branch_factor", "beam_rounds"):
      v = getattr(self, k)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"APO {k}={v!r}: must be a positive integer")


@dataclasses.dataclass
class Candidate:
  id: int
  prompt: str
  parent: int | None
  round: int
  critique: str = ""
  scores: dict = dataclasses.field(default_factory=dict)  # "round r val batch" / "round r full val" -> score


@dataclasses.dataclass
class APOResult:
  best: Candidate
  best_score: float
  candidates: list[Candidate]
  history: list[dict]  # per round: beam ids and scores, leader's full-validation score, best so far
  version: int | None = None  # resource version of the saved best prompt


def render_rollout(rec: RolloutRecord, max_chars: int) -> str:
  """A rollout as the critic reads it: each model turn, tool call (args -> result) and reward, in order."""
  lines = [f"Task: {json.dumps(rec.task, default=str)[:300]}"]
  for s in rec.spans:
    a = s.attributes
    if s.kind == "llm":
      lines.append(f"[model] {a['text']}")
    elif s.kind == "tool":
      lines.append(f"[tool {s.name}] {a.get('args')} -> {a.get('result', a.get('error'))}")
    elif s.kind == "reward":
      lines.append(f"[reward] {a['value']}")
  text = "\n".join(lines)
  return text if len(text) <= max_chars else text[:max_chars] + " ..."


def parse_prompt(text: str) -> str:
  """The editor's prompt: the last <prompt>...</prompt> block, else the whole reply; stripped."""
  found = re.findall(r"<prompt>(.*?)</prompt>", text, re.DOTALL)
  return (found[-1] if found else text.replace("<prompt>", "")).strip()


def apo(agent, seed_prompt: str, train_tasks: Sequence[Any], val_tasks: Sequence[Any], llm, critic, editor,
        store, settings: APOSettings = APOSettings(), *, resource: str = "prompt_template",
        resources: dict | None = None, num_workers: int = 8, log: Callable[[str], None] = print) -> APOResult:
  """Runs the search of the module docstring; `critic` / `editor` are OpenAI-style clients (`agents.llm`)."""
  rng = np.random.default_rng(settings.seed)
  base = dict(resources or {})
  candidates = [Candidate(0, seed_prompt, None, 0)]
  store.add_resource(f"{resource}:candidates", seed_prompt, {"id": 0, "parent": None, "round": 0})

  def run(prompt, tasks, mode):
    return run_rollouts(agent, list(tasks), llm, {**base, resource: prompt}, store, num_workers=num_workers, mode=mode)

  def score(c, tasks, key):
    recs = run(c.prompt, tasks, "val")
    c.scores[key] = float(np.mean([r.reward if r.reward is not None else 0.0 for r in recs]))
    return c.scores[key]

  def sample(tasks, n):
    return [tasks[i] for i in rng.choice(len(tasks), size=min(n, len(tasks)), replace=False)]

  beam, best, best_score, history = [candidates[0]], candidates[0], -np.inf, []
  for rnd in range(1, settings.beam_rounds + 1):
    if len(beam) < settings.beam_width:
      parents = [beam[i % len(beam)] for i in range(settings.beam_width)]
    else:
      parents = [beam[i] for i in rng.choice(len(beam), settings.beam_width, replace=False)]
    children = []
    for parent in parents:
      for _ in range(settings.branch_factor):
        recs = run(parent.prompt, sample(train_tasks, settings.gradient_batch_size), "train")
        failing = [r for r in recs if r.reward is None or r.reward < settings.success_reward] or recs
        experiments = "\n\n".join(f"### Experiment {i + 1} (reward {r.reward})\n{render_rollout(r, settings.max_trace_chars)}"
                                  for i, r in enumerate(failing))
        critique = critic.chat([{"role": "user", "content": CRITIC_PROMPT.format(prompt=parent.prompt,
                                                                                 experiments=experiments)}]).text
        edited = parse_prompt(editor.chat([{"role": "user", "content": EDITOR_PROMPT.format(
            prompt=parent.prompt, critique=critique)}]).text)
        if not edited:
          log(f"[apo round {rnd}] editor returned an empty prompt for parent {parent.id}; skipped")
          continue
        child = Candidate(len(candidates), edited, parent.id, rnd, critique)
        candidates.append(child)
        children.append(child)
        store.add_resource(f"{resource}:candidates", edited, {"id": child.id, "parent": parent.id, "round": rnd,
                                                             "critique": critique})
    pool = beam + children
    val_batch = sample(val_tasks, settings.val_batch_size)
    key = f"round {rnd} val batch"
    for c in pool:
      score(c, val_batch, key)
    beam = sorted(pool, key=lambda c: -c.scores[key])[:settings.beam_width]  # stable: ties keep pool order
    leader = score(beam[0], val_tasks, f"round {rnd} full val")
    if leader > best_score:
      best, best_score = beam[0], leader
    history.append({"round": rnd, "beam": [c.id for c in beam], "beam_scores": [c.scores[key] for c in beam],
                    "children": [c.id for c in children], "leader": beam[0].id, "leader_full_val": leader,
                    "best": best.id, "best_score": best_score})
    log(f"[apo round {rnd}] beam {[(c.id, round(c.scores[key], 3)) for c in beam]}, leader full-val "
        f"{leader:.3f}, best {best.id} ({best_score:.3f})")
  version = store.add_resource(resource, best.prompt, {
      "score": best_score, "candidate": best.id, "history": history,
      "candidates": [dataclasses.asdict(c) for c in candidates], "settings": dataclasses.asdict(settings)})
  return APOResult(best, float(best_score), candidates, history, version)
