"""One RL step's scored rollout groups: choose questions, roll out, add off-policy rows, score, refill.

`rl` is the run's `fineflax.rl.config.RLConfig` (a `config.rl` ConfigDict is read into one: absent keys
take its defaults).
Environment-agnostic: an env gives `rollout(policy, items, rng, mask_truncated) -> (rows, examples)`,
`demonstrations(policy, items) -> [(row, example)]` and `example(item)`; rewards are registry rewards
(`config.rewards`: name -> weight) of (question, row text, example).
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from fineflax.rewards import score_completions
from fineflax.rl.order import as_order
from fineflax.rl import rows as R
from fineflax.rl.advantages import dapo_overlong_penalty, zero_variance_groups
from fineflax.rl.config import RLConfig


@dataclasses.dataclass
class Groups:
  """rows (`fineflax.rl.rows`), rewards [N] (shaped), correct [N] (task success before shaping),
  idx (question id per group), examples (reward inputs per row), zero_var [groups], per_fn / errors
  (per-reward values and failure counts), replayed (groups holding a replayed row)."""
  rows: dict = dataclasses.field(default_factory=R.empty_rows)
  rewards: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float32))
  correct: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, bool))
  idx: list = dataclasses.field(default_factory=list)
  examples: list = dataclasses.field(default_factory=list)
  zero_var: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, bool))
  per_fn: dict = dataclasses.field(default_factory=dict)
  errors: dict = dataclasses.field(default_factory=dict)
  replayed: int = 0


def rollout_groups(env, policy, items, replay_qids, rng, *, group_size: int, guidance=None, replay=None,
                   entropy_fn=None, mask_truncated: bool = False) -> tuple[dict, list]:
  """(rows, examples) of len(items) groups of `group_size`: on-policy samples, then `guidance.n_off`
  copies of the item's demonstration (LUFFY), then its replayed trajectory when replay_qids[g] is set."""
  demos = guidance.demonstrations(env, policy, items) if guidance else [None] * len(items)
  n_off = [guidance.n_off if d is not None else 0 for d in demos]  # no trace: one more on-policy row
  n_on = [group_size - n - int(q is not None) for n, q in zip(n_off, replay_qids)]
  on_rows, on_examples = env.rollout(policy, [p for p, n in zip(items, n_on) for _ in range(n)], rng,
                                     mask_truncated=mask_truncated)
  rows, examples, start = R.empty_rows(), [], 0
  for g, item in enumerate(items):
    R.extend(rows, R.take(on_rows, range(start, start + n_on[g])))
    examples += on_examples[start:start + n_on[g]]
    start += n_on[g]
    for _ in range(n_off[g]):
      R.extend(rows, demos[g][0])
      examples.append(demos[g][1])
    if replay_qids[g] is not None:
      R.extend(rows, replay.row(replay_qids[g], env.tok, entropy_fn))
      examples.append(env.example(item))
  return rows, examples


def score(reward_weights, questions, rows, examples, *, max_new_tokens: int, overlong_buffer: int = 0):
  """(rewards [N] with DAPO's overlong shaping on on-policy rows, correct [N] = unshaped reward >= 1,
  per_fn, errors)."""
  r, per_fn, errors = score_completions(dict(reward_weights), questions, rows["text"], examples)
  correct = r >= 1.0
  if overlong_buffer:  # DAPO soft overlong punishment, on-policy rows only
    lengths = np.array([len(c) for c in rows["completion"]])
    penalty = np.asarray(dapo_overlong_penalty(lengths, max_new_tokens, overlong_buffer))
    r = r + penalty * ~np.asarray(rows["off_policy"])
  return r, correct, per_fn, errors


def collect(env, policy, train_items, order, cursor: int, rng, rl, reward_weights, *, guidance=None,
            replay=None, entropy_fn=None) -> Groups:
  """One step's groups; with DAPO dynamic sampling, extra rounds until `rl.prompts_per_step` groups
  have reward variance (or `rl.max_refill_rounds` run out). Round r reads `order` (`fineflax.rl.order`:
  question index at any position >= 0; a plain array is read cyclically) from cursor + 7919 r (with
  replay: less the retired questions, `Replay.fresh_order`); replayed questions (ids into `train_items`)
  come first."""
  rl = RLConfig.from_config(rl)
  out = Groups()
  rounds = 1 + (rl.max_refill_rounds if rl.dynamic_sampling else 0)
  order = as_order(order)
  order = replay.fresh_order(order) if replay else order
  for round_ in range(rounds):
    qids = replay.questions(rl.prompts_per_step) if replay else []
    fresh = [int(order[cursor + round_ * 7919 + i]) for i in range(rl.prompts_per_step - len(qids))]
    items = [train_items[int(q)] for q in qids] + [train_items[i] for i in fresh]
    rows, examples = rollout_groups(env, policy, items, qids + [None] * len(fresh),
                                    jax.random.fold_in(rng, round_), group_size=rl.group_size,
                                    guidance=guidance, replay=replay, entropy_fn=entropy_fn,
                                    mask_truncated=rl.mask_truncated)
    questions = [p.question for p in items for _ in range(rl.group_size)]
    r, correct, per_fn, errors = score(reward_weights, questions, rows, examples,
                                       max_new_tokens=rl.max_new_tokens,
                                       overlong_buffer=rl.overlong_buffer)
    R.extend(out.rows, rows)
    out.examples += examples
    out.rewards, out.correct = np.concatenate([out.rewards, r]), np.concatenate([out.correct, correct])
    out.idx += [int(q) for q in qids] + fresh
    out.replayed += len(qids)
    for k in per_fn:
      out.per_fn[k] = np.concatenate([out.per_fn.get(k, np.zeros(0)), per_fn[k]])
      out.errors[k] = out.errors.get(k, 0) + errors[k]
    out.zero_var = np.asarray(zero_variance_groups(out.rewards, rl.group_size))
    if rounds == 1 or (~out.zero_var).sum() >= rl.prompts_per_step:
      break
  return out


def kept_groups(groups: Groups, rl) -> np.ndarray:
  """bool [groups]: all groups, or with DAPO dynamic sampling the first `prompts_per_step` groups with
  reward variance (all groups when none has any)."""
  rl = RLConfig.from_config(rl)
  keep = np.ones(len(groups.idx), bool)
  zv = groups.zero_var
  if rl.dynamic_sampling and (~zv).any():
    keep = ~zv & (np.cumsum(~zv) <= rl.prompts_per_step)
  return keep
