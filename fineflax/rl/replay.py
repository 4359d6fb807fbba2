"""ExGRPO experience replay as a component of the RL job (objective "exgrpo").

Before each rollout round, once the batch solve rate has passed `threshold`, a share of the questions
comes from the buffer (`experience_split`), each group holding K - 1 fresh samples and the stored correct
trajectory of lowest entropy under the current policy. After scoring, every group updates the buffer
by the official rules (`ExperienceBuffer.add_group`: whole-group k, retire at K, skip k = 0, a text
stored once per question); retired questions are no longer drawn as fresh prompts (`fresh_order`).
"""
from __future__ import annotations

import numpy as np

from fineflax.rl import rows as R
from fineflax.rl.experience import ExperienceBuffer, experience_split, replay_active
from fineflax.rl.order import AliveOrder, as_order


class Replay:
  """The buffer, its sampling RNG and the settings of `config.rl.exgrpo`."""

  def __init__(self, group_size: int, cfg, seed: int):
    self.cfg = cfg
    self.buffer = ExperienceBuffer(group_size, sigma=cfg.sigma, max_per_question=cfg.max_per_question)
    self.rng = np.random.default_rng(seed)
    self.solve_rate = 0.0

  def questions(self, batch_size: int) -> list[str]:
    """Question ids to replay this round (none before the solve rate passes the threshold)."""
    if not replay_active(self.solve_rate, self.cfg.threshold):
      return []
    n = min(experience_split(batch_size, self.cfg.share)[0], len(self.buffer))
    return self.buffer.sample_questions(n, self.rng) if n else []

  def fresh_order(self, order):
    """The training order (`fineflax.rl.order`) less the retired questions (all K rollouts correct), as
    the official `skip_uid_set` removes them from the dataset; the whole order if every question is
    retired."""
    retired = set(self.buffer.retired)
    return AliveOrder(as_order(order), lambda q: str(q) not in retired) if retired else as_order(order)

  def row(self, question_id, tokenizer, entropy_fn) -> dict:
    """The replayed row of a question: its stored trajectory of lowest entropy, recorded log-probs."""
    t = self.buffer.select_trajectory(question_id, entropy_fn)
    prompt = self.buffer.questions[str(question_id)]["prompt"].tolist()
    return R.fixed_row(prompt, t.tokens.tolist(), tokenizer.decode(t.tokens), t.logp.tolist())

  def record(self, idx, rows, rewards, correct, group_size: int) -> None:
    """Update the buffer with each group g (question idx[g]): its fresh rows' correct trajectories
    and k = #correct over the whole group (the replayed row included)."""
    for g, q in enumerate(idx):
      sl = range(g * group_size, (g + 1) * group_size)
      fresh = [i for i in sl if not rows["off_policy"][i]]
      self.buffer.add_group(q, rows["prompt"][sl[0]], [rows["completion"][i] for i in fresh],
                            [rows["rollout_logp"][i] for i in fresh], [float(rewards[i]) for i in fresh],
                            correct=[bool(correct[i]) for i in fresh], k=int(np.sum(correct[sl.start:sl.stop])))

  def stats(self) -> dict:
    """Buffer size, retired questions and questions per bucket (for the step metrics)."""
    out = {"buffer_questions": float(len(self.buffer)), "buffer_retired": float(len(self.buffer.retired))}
    out.update({f"buffer_bucket_{k}": float(len(v)) for k, v in self.buffer.buckets().items()})
    return out

  def state_dict(self) -> dict:
    return {"buffer": self.buffer.state_dict(), "solve_rate": self.solve_rate}

  def load_state_dict(self, state: dict) -> None:
    self.buffer = ExperienceBuffer.from_state_dict(state["buffer"])
    self.solve_rate = float(state["solve_rate"])
