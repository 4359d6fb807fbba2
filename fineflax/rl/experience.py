"""ExGRPO experience buffer (Zhan et al. 2025): correct trajectories per question, bucketed by difficulty.

Rules (paper Sec. 3.1, as fineflax implements them):
- After each rollout group of K rows for question q (a replayed row included), k = #correct over the
  whole group (official ExGRPO code). k == K retires q (its stored trajectories are dropped and it is
  never stored again); k == 0 leaves q's entry as it was (the official code skips the update);
  otherwise q's correct fresh (on-policy) completions are appended (prompt tokens, completion tokens,
  the per-token log-probs recorded at rollout, reward; newest `max_per_question` kept) and q moves to
  bucket k (its latest correctness). A completion q already holds (the same tokens, stored earlier or
  earlier in the same group) is not stored again (the official `collect_experience_entries` compares
  the decoded text), so repeats do not crowd distinct trajectories out of `max_per_question`.
- Retired questions are also left out of the fresh training prompts (the official `skip_uid_set`
  filters the dataset's indices): `fineflax.rl.replay.Replay.fresh_order`.
- Replay sampling: a bucket k is drawn with probability
      p(k) = N(k; mu, sigma) / sum_{k' non-empty} N(k'; mu, sigma),   mu = K/2, sigma = 1,
  then a question uniformly inside the bucket. (The paper writes the Gaussian over Acc = k/K with
  mu = 0.5; fineflax uses bucket units so sigma = 1 means one bucket.)
- The replayed trajectory of q is the stored one of lowest entropy under the CURRENT policy.
- Replay starts once the batch solve rate passes 0.35 (`replay_active`); then a share (0.5) of each
  batch's questions come from the buffer (`experience_split`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

import numpy as np


@dataclasses.dataclass
class Trajectory:
  """One stored correct completion: tokens [L] int32, recorded logp [L] float32, scalar reward."""
  tokens: np.ndarray
  logp: np.ndarray
  reward: float


def replay_active(solve_rate: float, threshold: float = 0.35) -> bool:
  """ExGRPO delayed start: replay only once the batch solve rate exceeds `threshold`."""
  return float(solve_rate) > threshold


def experience_split(batch_size: int, share: float = 0.5) -> tuple[int, int]:
  """(n_experience, n_fresh) questions of a batch: n_experience = round(share * batch_size)."""
  if not 0.0 <= share <= 1.0:
    raise ValueError(f"experience share must be in [0, 1], got {share}")
  n_exp = int(round(share * batch_size))
  return n_exp, batch_size - n_exp


class ExperienceBuffer:
  """question id (str) -> {k, prompt, [Trajectory]}; retired ids; Gaussian bucket sampling."""

  def __init__(self, group_size: int, mu: Optional[float] = None, sigma: float = 1.0,
               max_per_question: int = 8):
    if group_size < 1 or sigma <= 0 or max_per_question < 1:
      raise ValueError(f"bad buffer settings: group_size={group_size}, sigma={sigma}, "
                       f"max_per_question={max_per_question}")
    self.group_size = int(group_size)
    self.mu = self.group_size / 2.0 if mu is None else float(mu)
    self.sigma = float(sigma)
    self.max_per_question = int(max_per_question)
    self.questions: dict[str, dict] = {}
    self.retired: set[str] = set()

  def __len__(self) -> int:
    return len(self.questions)

  def __contains__(self, question_id) -> bool:
    return str(question_id) in self.questions

  def add_group(self, question_id, prompt_tokens, completions: Sequence, logps: Sequence,
                rewards: Sequence[float], correct: Optional[Sequence[bool]] = None,
                k: Optional[int] = None) -> int:
    """Record one rollout group of question `question_id`; returns k.

    completions[i] int tokens [L_i], logps[i] recorded per-token logp [L_i], rewards[i] a float: the
    group's fresh on-policy rows (all K, or fewer when the group also held a replayed row); correct
    defaults to reward > 0. k = #correct over the whole group of K (default: sum(correct), which then
    needs all K rows).
    """
    qid = str(question_id)
    n = len(completions)
    if not len(logps) == len(rewards) == n or n > self.group_size:
      raise ValueError(f"question {qid}: expected <= {self.group_size} completions with as many logps and "
                       f"rewards, got {n}/{len(logps)}/{len(rewards)}")
    correct = [r > 0 for r in rewards] if correct is None else [bool(c) for c in correct]
    if len(correct) != n:
      raise ValueError(f"question {qid}: expected {n} correctness flags, got {len(correct)}")
    if k is None:
      if n != self.group_size:
        raise ValueError(f"question {qid}: k (correct answers of the whole group) is needed when only "
                         f"{n} of {self.group_size} rows are given")
      k = int(sum(correct))
    k = int(k)
    if not 0 <= k <= self.group_size:
      raise ValueError(f"question {qid}: k={k} outside [0, {self.group_size}]")
    if qid in self.retired or k == 0:
      return k
    if k == self.group_size:
      self.retired.add(qid)
      self.questions.pop(qid, None)
      return k
    entry = self.questions.get(qid) or {"k": k, "prompt": np.asarray(prompt_tokens, np.int32),
                                        "trajectories": []}
    entry["k"] = k
    held = {t.tokens.tobytes() for t in entry["trajectories"]}
    for toks, lp, r, ok in zip(completions, logps, rewards, correct):
      if ok:
        toks, lp = np.asarray(toks, np.int32), np.asarray(lp, np.float32)
        if toks.shape != lp.shape or toks.ndim != 1:
          raise ValueError(f"question {qid}: tokens {toks.shape} and logp {lp.shape} must be equal 1-D")
        if toks.tobytes() in held:  # the same completion is stored once
          continue
        held.add(toks.tobytes())
        entry["trajectories"].append(Trajectory(toks, lp, float(r)))
    entry["trajectories"] = entry["trajectories"][-self.max_per_question:]
    if entry["trajectories"]:
      self.questions[qid] = entry
    return k

  def buckets(self) -> dict[int, list[str]]:
    """k -> sorted question ids currently in bucket k (non-empty buckets only)."""
    out: dict[int, list[str]] = {}
    for qid in sorted(self.questions):
      out.setdefault(self.questions[qid]["k"], []).append(qid)
    return out

  def bucket_probs(self, buckets: Optional[dict] = None) -> dict[int, float]:
    """p(k) = N(k; mu, sigma) normalised over the non-empty buckets."""
    buckets = self.buckets() if buckets is None else buckets
    w = {k: math.exp(-0.5 * ((k - self.mu) / self.sigma) ** 2) for k in buckets if buckets[k]}
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}

  def sample_questions(self, n: int, rng: np.random.Generator, replace: bool = False) -> list[str]:
    """n question ids: bucket by `bucket_probs`, then uniform within it.

    replace=False (default) never repeats a question; probabilities are renormalised over the
    buckets that still hold unpicked questions. Raises if fewer than n questions are stored.
    """
    buckets = self.buckets()
    if not replace and n > len(self.questions):
      raise ValueError(f"asked for {n} distinct questions, buffer holds {len(self.questions)}")
    if n and not buckets:
      raise ValueError("experience buffer is empty")
    picked = []
    for _ in range(n):
      probs = self.bucket_probs(buckets)
      ks = sorted(probs)
      k = ks[rng.choice(len(ks), p=np.array([probs[k] for k in ks]))]
      j = int(rng.integers(len(buckets[k])))
      picked.append(buckets[k][j])
      if not replace:
        buckets[k] = buckets[k][:j] + buckets[k][j + 1:]
    return picked

  def select_trajectory(self, question_id, entropy_fn: Callable) -> Trajectory:
    """The stored trajectory of `question_id` with the lowest entropy under the current policy.

    entropy_fn(prompt_tokens, trajectories) -> one float per trajectory (e.g. the mean token
    entropy of the completion given the prompt, computed with the current parameters).
    Ties go to the earliest stored trajectory.
    """
    entry = self.questions[str(question_id)]
    trajs = entry["trajectories"]
    ent = np.asarray(entropy_fn(entry["prompt"], trajs), np.float64).reshape(-1)
    if ent.shape[0] != len(trajs):
      raise ValueError(f"entropy_fn returned {ent.shape[0]} values for {len(trajs)} trajectories")
    return trajs[int(np.argmin(ent))]

  def state_dict(self) -> dict:
    """JSON-able pytree (dicts, lists, str, int, float) of the whole buffer.

    Save it with orbax as `ocp.args.JsonSave(buffer.state_dict())` (orbax's array handlers refuse
    strings and zero-size arrays) or `json.dump`. float32 log-probs round-trip exactly through JSON.
    """
    questions = {}
    for qid, e in self.questions.items():
      t = e["trajectories"]
      questions[qid] = {"k": int(e["k"]), "prompt": e["prompt"].tolist(),
                        "tokens": [x.tokens.tolist() for x in t], "logp": [x.logp.tolist() for x in t],
                        "reward": [float(x.reward) for x in t]}
    return {"group_size": self.group_size, "mu": self.mu, "sigma": self.sigma,
            "max_per_question": self.max_per_question, "questions": questions,
            "retired": sorted(self.retired)}

  @classmethod
  def from_state_dict(cls, state: dict) -> "ExperienceBuffer":
    """Inverse of `state_dict` (leaves may be lists or NumPy arrays)."""
    buf = cls(int(state["group_size"]), float(state["mu"]), float(state["sigma"]),
              int(state["max_per_question"]))
    for qid, e in (state.get("questions") or {}).items():
      rewards = np.asarray(e["reward"], np.float32).reshape(-1)
      trajs = [Trajectory(np.asarray(tk, np.int32), np.asarray(lp, np.float32), float(r))
               for tk, lp, r in zip(e["tokens"], e["logp"], rewards)]
      buf.questions[str(qid)] = {"k": int(e["k"]), "prompt": np.asarray(e["prompt"], np.int32),
                                 "trajectories": trajs}
    buf.retired = {str(q) for q in (state.get("retired") or [])}
    return buf
