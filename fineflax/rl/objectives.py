"""The RL objective table: name -> loss function, the batch fields it reads, its config -> loss kwargs.

Adding an objective = one `Objective` entry here + its loss function in `fineflax.rl.losses`.

Every loss is called as loss(logp, entropy, batch, **kwargs(config.rl)) -> (scalar, metrics), where
logp / entropy [B, N] are the current policy's, and batch holds the common fields of
`fineflax.rl.step` (completion, mask, old_logp, advantages, ref_logp when beta > 0; behaviour_logp, the
rollout engine's log-probs, when the job records them; num_rows when the batch was padded to split over devices; loss_weights / num_tokens in a micro-batch: `norms`) plus
`batch_fields`. In a packed micro-batch (`fineflax.rl.micro`) every field is per token [R, T].
`off_policy` names the rows the RL job adds to each group: "guidance" (LUFFY: `rl.luffy.n_off`
demonstrations) or "replay" (ExGRPO: one stored trajectory per replayed question). The settings are
checked by `fineflax.rl.config.RLConfig` (its section's own dataclass, then the entry's `check`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from fineflax.config_checks import ConfigError, check
from fineflax.rl.importance import resolve_mode
from fineflax.rl.losses import exgrpo_loss, grpo_loss, luffy_loss


@dataclasses.dataclass(frozen=True)
class Objective:
  loss: Callable[..., tuple]
  batch_fields: tuple[str, ...]
  kwargs: Callable[[Any], dict]
  off_policy: str | None = None  # None | "guidance" | "replay"
  section: str | None = None  # config.rl subsection with the objective's own fields
  check: Callable[[Any], None] = lambda rl: None  # cross-field checks of the RLConfig (fineflax.rl.config)
  critic: bool = False  # PPO: a value model, GAE advantages per token (fineflax.rl.ppo, fineflax.rl.minibatch)


def common_kwargs(rl) -> dict:
  """Loss settings every objective shares (clip range, KL, entropy bonus, aggregation, the rollout importance
  correction of `fineflax.rl.importance`)."""
  return dict(epsilon_low=rl.epsilon_low, epsilon_high=rl.epsilon_high, dual_clip=rl.dual_clip or None,
              beta=rl.beta, entropy_coef=rl.entropy_coef, agg_mode=rl.agg_mode, max_len=rl.max_new_tokens,
              importance=resolve_mode(rl.importance, getattr(rl, "async_steps", 0)),
              importance_level=rl.importance_level, importance_cap=rl.importance_cap)


def norms(batch) -> dict:
  """The normalisers a loss reads from its batch: num_rows (rows before padding), and for a micro-batch
  the whole (mini-)batch's `loss_weights` / `num_tokens` (`fineflax.rl.micro`)."""
  return dict(num_rows=batch.get("num_rows"), weights=batch.get("loss_weights"),
              num_tokens=batch.get("num_tokens"))


def _grpo(logp, entropy, batch, **kw):
  return grpo_loss(logp, batch["old_logp"], batch.get("ref_logp"), batch["advantages"], batch["mask"],
                   entropy=entropy, behaviour_logp=batch.get("behaviour_logp"), **norms(batch), **kw)


def _luffy(logp, entropy, batch, **kw):
  return luffy_loss(logp, batch["old_logp"], batch["advantages"], batch["mask"], batch["is_off_policy"],
                    ref_logp=batch.get("ref_logp"), entropy=entropy, behaviour_logp=batch.get("behaviour_logp"),
                    **norms(batch), **kw)


def _exgrpo(logp, entropy, batch, **kw):
  return exgrpo_loss(logp, batch["old_logp"], batch["behaviour_logp"], batch["advantages"], batch["mask"],
                     batch["is_off_policy"], ref_logp=batch.get("ref_logp"), entropy=entropy,
                     **norms(batch), **kw)


def _check_luffy(rl) -> None:
  """LUFFY's groups hold n_off demonstrations and at least one on-policy row."""
  check("rl.luffy.n_off", rl.luffy.n_off, lambda v: isinstance(v, int) and 1 <= v < rl.group_size,
        f"LUFFY needs 1 <= n_off < group_size={rl.group_size}")


OBJECTIVES: dict[str, Objective] = {
    "grpo": Objective(_grpo, (), lambda rl: dict(common_kwargs(rl), clip=rl.clip)),
    "luffy": Objective(_luffy, ("is_off_policy",),
                       lambda rl: dict(common_kwargs(rl), gamma=rl.luffy.gamma, on_policy_clip=rl.clip,
                                       shape_off_policy=rl.luffy.shaping),
                       off_policy="guidance", section="luffy", check=_check_luffy),
    "exgrpo": Objective(_exgrpo, ("is_off_policy", "behaviour_logp"),
                        lambda rl: dict(common_kwargs(rl), replay_beta=rl.exgrpo.beta, on_policy_clip=rl.clip),
                        off_policy="replay", section="exgrpo"),
    # PPO (Search-R1): the clipped surrogate with GAE advantages [B, N] of the critic; raw rewards in the batch
    "ppo": Objective(_grpo, ("rewards",), lambda rl: dict(common_kwargs(rl), clip=rl.clip), section="ppo",
                     critic=True),
}


def get_objective(name: str) -> Objective:
  if name not in OBJECTIVES:
    raise ConfigError(f"config.rl.objective={name!r}: choose one of {', '.join(map(repr, OBJECTIVES))}")
  return OBJECTIVES[name]
