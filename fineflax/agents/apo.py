"""Automatic prompt optimisation (APO): beam search over a prompt-template resource with textual gradients,
following Agent Lightning's `agentlightning.algorithm.apo.APO` (same parameter names).

  seed = candidate 0, scored on the whole validation set; best = seed
  beam = [seed]
  for round in 1..beam_rounds (with `time_budget_s`: a round starts only if the search would stay within the
                               budget, assuming it takes as long as the previous round):
    parents = beam_width prompts sampled from the beam (the beam repeated when it is smaller)
    for each parent, branch_factor times (all expansions of a round run concurrently):
      run the agent with the parent on a train batch of gradient_batch_size tasks; the critic LLM reads the
      failing rollouts (reward < success_reward; all of them when none fails), rendered from their spans
      (model turns, tool calls and results, reward), and writes a critique (the textual gradient); the
      editor LLM rewrites the parent along it (its reply is prefilled with "<prompt>" when the client can
      continue a chat) -> a child candidate (parent id, round, critique)
      a child whose prompt is unusable (`check_prompt`: empty, too short/long, equal to its parent, lacking a
      `required` string) or whose critic/editor call failed is logged with the reason and never scored
    candidates = beam + usable children, each scored on the round's validation batch (val_batch_size tasks;
    mean reward of `eval_agent`); beam = the best beam_width (ties: earlier candidate first)
    the beam leader is scored on the whole validation set (the batch score when the batch is the whole set);
    it becomes the best prompt when it beats the best (the seed included)
  the best prompt is saved as a new version of the resource (meta: its score, id and every candidate).
Every candidate is logged (id, parent, round, prompt, critique, every score it got, why it was rejected) in
`APOResult.candidates` and as a version of the store resource "<resource>:candidates".
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import time
from typing import Any, Callable, Sequence

import numpy as np

from fineflax.agents.runner import RolloutRecord, run_rollouts

CRITIC_PROMPT = (
    "You optimize the system prompt of an LLM agent.\n\n## Prompt\n{prompt}\n\n## Experiments with this prompt\n"
    "{experiments}\n\n## Your task\nGive a brief critique listing specific causes of the failures and concrete, "
    "testable changes to the prompt (format, constraints, ordering, definitions) that would raise the reward.")
EDITOR_PROMPT = (
    "Revise the prompt using the critique as constraints and improvement guide. Define what to do, then how. "
    "{required}Return only the improved prompt between <prompt> and </prompt>.\n\n## Prompt\n{prompt}\n\n"
    "## Critique\n{critique}")
EDITOR_PREFILL = "<prompt>"  # the start of the editor's reply when its client can continue a chat


@dataclasses.dataclass
class APOSettings:
  val_batch_size: int = 16  # validation tasks scoring each round's candidates
  gradient_batch_size: int = 4  # train rollouts behind each critique
  beam_width: int = 4  # prompts kept after each round
  branch_factor: int = 4  # children per parent
  beam_rounds: int = 3  # rounds of expansion and selection
  success_reward: float = 1.0  # a rollout with a lower reward is a failure the critic sees
  max_trace_chars: int = 1500  # characters of each rendered rollout shown to the critic
  min_prompt_chars: int = 20  # a shorter rewritten prompt is rejected
  max_prompt_chars: int = 2000  # a longer one too
  required: tuple = ()  # strings every rewritten prompt must contain (e.g. the tool-call syntax)
  time_budget_s: float = 0.0  # no round starts that would end past this many seconds (0 = no limit)
  seed: int = 0

  def __post_init__(self):
    for k in ("val_batch_size", "gradient_batch_size", "beam_width", "branch_factor", "beam_rounds",
              "min_prompt_chars", "max_prompt_chars"):
      v = getattr(self, k)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"APO {k}={v!r}: must be a positive integer")
    if self.time_budget_s < 0:
      raise ValueError(f"APO time_budget_s={self.time_budget_s!r}: must be >= 0 (0 = no limit)")
    self.required = tuple(self.required)


@dataclasses.dataclass
class Candidate:
  id: int
  prompt: str
  parent: int | None
  round: int
  critique: str = ""
  scores: dict = dataclasses.field(default_factory=dict)  # "round r val batch" / "round r full val" -> score
  rejected: str = ""  # why the candidate was skipped ("" = usable); the prompt is then the editor's raw reply


@dataclasses.dataclass
class APOResult:
  best: Candidate
  best_score: float
  candidates: list[Candidate]
  history: list[dict]  # round 0 (the seed) and per round: beam ids and scores, leader's full-val score, best
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
  """The editor's prompt: the last closed <prompt>...</prompt> block; else the text after the last <prompt>
  (a reply cut at its budget or stop string); else the whole reply. Stripped, with stray tags removed."""
  found = re.findall(r"<prompt>((?:(?!<prompt>).)*?)</prompt>", text, re.DOTALL)  # innermost blocks
  if found:
    out = found[-1]
  elif "<prompt>" in text:
    out = text.rsplit("<prompt>", 1)[1]
  else:
    out = text
  return out.replace("<prompt>", "").replace("</prompt>", "").strip()


def check_prompt(prompt: str, parent: str, s: APOSettings) -> str:
  """Why `prompt` is unusable as a rewrite of `parent` ("" when usable)."""
  if not prompt:
    return "empty"
  if len(prompt) < s.min_prompt_chars:
    return f"shorter than {s.min_prompt_chars} characters"
  if len(prompt) > s.max_prompt_chars:
    return f"longer than {s.max_prompt_chars} characters"
  if prompt.split() == parent.split():
    return "same as its parent"
  missing = [r for r in s.required if r not in prompt]
  return f"lacks {missing}" if missing else ""


def continue_chat(client, messages, prefill: str, **kw) -> str:
  """The client's reply to `messages`, started with `prefill` when the client can continue a reply (an
  in-process model with a tokenizer: the chat template's prompt + prefill, completed); else a plain chat."""
  tok = getattr(client, "tokenizer", None)
  if prefill and tok is not None and hasattr(client, "prompt_ids"):
    from fineflax.sampling import format_chat
    return prefill + client.complete(format_chat(tok, messages) + prefill, **kw).text
  return client.chat(messages, **kw).text


def apo(agent, seed_prompt: str, train_tasks: Sequence[Any], val_tasks: Sequence[Any], llm, critic, editor,
        store, settings: APOSettings = APOSettings(), *, resource: str = "prompt_template",
        resources: dict | None = None, num_workers: int = 8, eval_agent=None,
        log: Callable[[str], None] = print, clock: Callable[[], float] = time.time) -> APOResult:
  """Runs the search of the module docstring; `critic` / `editor` are OpenAI-style clients (`agents.llm`);
  `eval_agent` (default `agent`) scores candidates, e.g. the agent with greedy decoding."""
  s, t_start = settings, clock()
  rng = np.random.default_rng(s.seed)
  base, eval_agent = dict(resources or {}), eval_agent or agent
  candidates: list[Candidate] = []

  def add(c: Candidate):
    candidates.append(c)
    store.add_resource(f"{resource}:candidates", c.prompt, {k: v for k, v in dataclasses.asdict(c).items()
                                                            if k not in ("prompt", "scores")})

  def run(a, prompt, tasks, mode):
    return run_rollouts(a, list(tasks), llm, {**base, resource: prompt}, store, num_workers=num_workers, mode=mode)

  def score_all(cands, tasks, key):
    """Every candidate's mean reward on `tasks`, all scored concurrently (a local model batches them)."""
    with concurrent.futures.ThreadPoolExecutor(max(len(cands), 1)) as pool:
      recs = list(pool.map(lambda c: run(eval_agent, c.prompt, tasks, "val"), cands))
    for c, rs in zip(cands, recs):
      c.scores[key] = float(np.mean([r.reward if r.reward is not None else 0.0 for r in rs]))

  def sample(tasks, n):
    return [tasks[i] for i in rng.choice(len(tasks), size=min(n, len(tasks)), replace=False)]

  def expand(parent: Candidate, batch) -> tuple[str, str, str]:
    """(prompt, critique, reason rejected) of one child of `parent`; failures become a reason."""
    critique = raw = ""
    try:
      recs = run(agent, parent.prompt, batch, "train")
      failing = [r for r in recs if r.reward is None or r.reward < s.success_reward] or recs
      experiments = "\n\n".join(f"### Experiment {i + 1} (reward {r.reward})\n{render_rollout(r, s.max_trace_chars)}"
                                for i, r in enumerate(failing))
      critique = critic.chat([{"role": "user", "content": CRITIC_PROMPT.format(
          prompt=parent.prompt, experiments=experiments)}]).text.strip()
      if not critique:
        return "", critique, "the critic returned an empty critique"
      required = f"Keep these exact strings in the prompt: {', '.join(s.required)}. " if s.required else ""
      raw = continue_chat(editor, [{"role": "user", "content": EDITOR_PROMPT.format(
          prompt=parent.prompt, critique=critique, required=required)}], EDITOR_PREFILL, stop=["</prompt>"])
    except Exception as e:  # a failed rollout batch or endpoint call skips this child only
      return raw, critique, f"{type(e).__name__}: {e}"
    prompt = parse_prompt(raw)
    reason = check_prompt(prompt, parent.prompt, s)
    return (raw if reason else prompt), critique, reason

  add(Candidate(0, seed_prompt, None, 0))
  score_all(candidates[:1], val_tasks, "round 0 full val")
  beam, best = [candidates[0]], candidates[0]
  best_score = candidates[0].scores["round 0 full val"]
  history = [{"round": 0, "beam": [0], "beam_scores": [best_score], "children": [], "rejected": [], "leader": 0,
              "leader_full_val": best_score, "best": 0, "best_score": best_score, "elapsed_s": clock() - t_start}]
  log(f"[apo round 0] seed prompt full-val {best_score:.3f}")
  last_round_s = 0.0
  for rnd in range(1, s.beam_rounds + 1):
    t_round = clock()
    if s.time_budget_s and t_round - t_start + last_round_s > s.time_budget_s:
      log(f"[apo] time budget {s.time_budget_s:.0f} s: {t_round - t_start:.0f} s spent, the last round took "
          f"{last_round_s:.0f} s; stopping after {rnd - 1} rounds")
      break
    if len(beam) < s.beam_width:
      parents = [beam[i % len(beam)] for i in range(s.beam_width)]
    else:
      parents = [beam[i] for i in rng.choice(len(beam), s.beam_width, replace=False)]
    jobs = [(p, sample(train_tasks, s.gradient_batch_size)) for p in parents for _ in range(s.branch_factor)]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
      outs = list(pool.map(lambda job: expand(*job), jobs))
    children, rejected = [], []
    for (parent, _), (prompt, critique, reason) in zip(jobs, outs):
      c = Candidate(len(candidates), prompt, parent.id, rnd, critique, rejected=reason)
      add(c)
      (rejected if reason else children).append(c)
      if reason:
        log(f"[apo round {rnd}] candidate {c.id} (parent {parent.id}) rejected: {reason}; reply {prompt[:200]!r}")
      else:
        log(f"[apo round {rnd}] candidate {c.id} (parent {parent.id}): {prompt[:200]!r}")
    pool_ = beam + children
    val_batch = sample(val_tasks, s.val_batch_size)
    key, full = f"round {rnd} val batch", f"round {rnd} full val"
    score_all(pool_, val_batch, key)
    beam = sorted(pool_, key=lambda c: -c.scores[key])[:s.beam_width]  # stable: ties keep pool order
    if len(val_batch) == len(val_tasks):
      beam[0].scores[full] = beam[0].scores[key]
    else:
      score_all(beam[:1], val_tasks, full)
    leader = beam[0].scores[full]
    if leader > best_score:
      best, best_score = beam[0], leader
    history.append({"round": rnd, "beam": [c.id for c in beam], "beam_scores": [c.scores[key] for c in beam],
                    "children": [c.id for c in children], "rejected": [c.id for c in rejected],
                    "leader": beam[0].id, "leader_full_val": leader, "best": best.id, "best_score": best_score,
                    "elapsed_s": clock() - t_start})
    last_round_s = clock() - t_round
    log(f"[apo round {rnd}] scores {[(c.id, round(c.scores[key], 3)) for c in pool_]}; beam "
        f"{[c.id for c in beam]}, leader full-val {leader:.3f}, best {best.id} ({best_score:.3f}), "
        f"{clock() - t_start:.0f} s")
  version = store.add_resource(resource, best.prompt, {
      "score": best_score, "candidate": best.id, "history": history,
      "candidates": [dataclasses.asdict(c) for c in candidates], "settings": dataclasses.asdict(s)})
  return APOResult(best, float(best_score), candidates, history, version)
