"""The typed settings of one RL run (`config.rl`), checked once when built (as tunix's `GRPOConfig`).

`RLConfig.from_config(config.rl)` reads the ConfigDict of `configs/common.py:rl` (with its objective's
section, `luffy` or `exgrpo`); every field is checked in `__post_init__` and a bad one raises `ConfigError`
"config.rl.KEY=VALUE: allowed values". Absent keys take the defaults below (those of `configs/common.py`
where it sets one). Keys not declared here stay readable as attributes (`extra`): an objective added to
`fineflax.rl.objectives.OBJECTIVES` may read its own fields in its `kwargs(rl)`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from fineflax.config_checks import (ConfigError, check, choice, interval, non_negative_int, positive_integer)
from fineflax.rl.advantages import SCALES
from fineflax.rl.importance import LEVELS as IS_LEVELS, MODES as IS_MODES, resolve_mode as resolve_importance
from fineflax.rl.losses import AGG_MODES
from fineflax.rl.objectives import Objective, get_objective

INF = float("inf")


def _items(section) -> dict:
  """{key: value} of a ConfigDict or mapping (FieldReferences resolved)."""
  return {k: section[k] for k in section.keys()}


@dataclasses.dataclass(frozen=True)
class LuffyConfig:
  """LUFFY guidance (`config.rl.luffy`): n_off demonstration rows per group, policy shaping
  f(p) = p / (p + gamma) (shaping=False: the paper's -A * p ablation), traces file ("" = the env's)."""
  n_off: int = 1
  gamma: float = 0.1
  shaping: bool = True
  traces_path: str = ""

  def __post_init__(self):
    check("rl.luffy.gamma", self.gamma, *interval(0.0, INF, lo_open=True))
    check("rl.luffy.traces_path", self.traces_path, lambda v: isinstance(v, str), "a path or ''")


@dataclasses.dataclass(frozen=True)
class ExGRPOConfig:
  """ExGRPO replay (`config.rl.exgrpo`): importance-weight shaping w / (w + beta), bucket weights
  N(k; K/2, sigma), replay once the solve rate passes `threshold`, `share` of each batch replayed, at
  most `max_per_question` stored trajectories a question."""
  beta: float = 0.1
  sigma: float = 1.0
  threshold: float = 0.35
  share: float = 0.5
  max_per_question: int = 8

  def __post_init__(self):
    check("rl.exgrpo.beta", self.beta, *interval(0.0, INF, lo_open=True))
    check("rl.exgrpo.sigma", self.sigma, *interval(0.0, INF, lo_open=True))
    check("rl.exgrpo.threshold", self.threshold, *interval(0.0, 1.0))
    check("rl.exgrpo.share", self.share, *interval(0.0, 1.0))
    check("rl.exgrpo.max_per_question", self.max_per_question, *positive_integer())


@dataclasses.dataclass(frozen=True)
class PPOConfig:
  """PPO's critic and rewards (`config.rl.ppo`, `fineflax.rl.ppo`; defaults of Search-R1's train_ppo.sh /
  verl's ppo_trainer.yaml): critic "lora" (its own LoRA + value head on the base) or "full" (a trainable
  float32 copy of the model + value head, as verl's critic; needs model.quant=none), its AdamW peak lr and
  warmup steps, value clip, GAE gamma / lam, the KL penalty in the reward (verl apply_kl_penalty, fixed
  kl_ctrl), the value loss coefficient."""
  critic: str = "lora"
  critic_lr: float = 1e-5
  critic_warmup_steps: int = 0
  cliprange_value: float = 0.5
  gamma: float = 1.0
  lam: float = 1.0
  kl_in_reward: bool = True
  kl_coef: float = 0.001
  kl_penalty: str = "kl"
  value_loss_coef: float = 1.0

  def __post_init__(self):
    from fineflax.rl.ppo import KL_PENALTIES
    check("rl.ppo.critic", self.critic, *choice(("lora", "full")))
    check("rl.ppo.critic_lr", self.critic_lr, *interval(0.0, INF, lo_open=True))
    check("rl.ppo.critic_warmup_steps", self.critic_warmup_steps, *non_negative_int())
    check("rl.ppo.cliprange_value", self.cliprange_value, *interval(0.0, INF, lo_open=True))
    check("rl.ppo.gamma", self.gamma, *interval(0.0, 1.0))
    check("rl.ppo.lam", self.lam, *interval(0.0, 1.0))
    check("rl.ppo.kl_in_reward", self.kl_in_reward, lambda v: isinstance(v, bool), "true or false")
    check("rl.ppo.kl_coef", self.kl_coef, *interval(0.0, INF))
    check("rl.ppo.kl_penalty", self.kl_penalty, *choice(KL_PENALTIES))
    check("rl.ppo.value_loss_coef", self.value_loss_coef, *interval(0.0, INF, lo_open=True))


SECTIONS = {"luffy": LuffyConfig, "exgrpo": ExGRPOConfig, "ppo": PPOConfig}


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """Rollouts (prompts_per_step questions x group_size rows, max_new_tokens, temperature, top_p,
  dense_rollouts), the loss (objective, clip, epsilon_low/high, dual_clip, beta (KL), entropy_coef,
  agg_mode, advantage_scale), num_iterations updates per batch, DAPO (mask_truncated, overlong_buffer,
  dynamic_sampling with max_refill_rounds), sft_steps leading SFT steps; the update's batching
  (mini_batch_size prompts per optimizer step, micro-batches of micro_batch_size rows or micro_batch_tokens
  tokens per device: `fineflax.rl.minibatch`), old_logp ("auto": reuse the current log-probs when the batch
  gets one optimizer step, `reuses_current_logp`; "recompute"), skip_grad_bound (ExGRPO); the rollout
  importance correction (importance none / tis / mis, importance_level token / sequence, importance_cap C:
  `fineflax.rl.importance`; "auto" is resolved here to tis when async_steps >= 1, else none); async_steps k
  (rollouts may use weights up to k updates old: `fineflax.rl.async_rollouts`); the objective's section."""
  objective: str = "grpo"
  prompts_per_step: int = 1
  group_size: int = 2
  max_new_tokens: int = 128
  temperature: float = 1.0
  top_p: float = 1.0
  dense_rollouts: bool = False
  decode_impl: str = "scan"
  num_iterations: int = 1
  clip: bool = True
  epsilon_low: float = 0.2
  epsilon_high: float = 0.28
  dual_clip: float = 0.0
  beta: float = 0.0
  entropy_coef: float = 0.0
  agg_mode: str = "token-mean"
  advantage_scale: str = "group"
  mask_truncated: bool = False
  overlong_buffer: int = 0
  dynamic_sampling: bool = False
  max_refill_rounds: int = 2
  sft_steps: int = 0
  mini_batch_size: int = 0
  micro_batch_size: int = 0
  micro_batch_tokens: int = 0
  old_logp: str = "auto"
  skip_grad_bound: float = 0.0
  importance: str = "auto"
  importance_level: str = "token"
  importance_cap: float = 2.0
  async_steps: int = 0
  luffy: LuffyConfig | None = None
  exgrpo: ExGRPOConfig | None = None
  ppo: PPOConfig | None = None
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # keys not declared above

  @classmethod
  def from_config(cls, rl) -> "RLConfig":
    """The checked settings of a `config.rl` ConfigDict (or mapping); an RLConfig is returned as is."""
    if isinstance(rl, RLConfig):
      return rl
    values = _items(rl)
    declared = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    sections = {name: SECTIONS[name](**{k: v for k, v in _items(values.pop(name)).items()
                                        if k in {f.name for f in dataclasses.fields(SECTIONS[name])}})
                for name in list(values) if name in SECTIONS and values[name] is not None}
    known = {k: values.pop(k) for k in list(values) if k in declared}
    return cls(**known, **sections, extra=values)

  def __post_init__(self):
    entry = get_objective(self.objective)
    check("rl.agg_mode", self.agg_mode, *choice(AGG_MODES))
    check("rl.advantage_scale", self.advantage_scale, *choice(SCALES))
    for key in ("prompts_per_step", "max_new_tokens", "num_iterations"):
      check(f"rl.{key}", getattr(self, key), *positive_integer())
    if entry.critic:  # GAE advantages: one rollout a prompt is enough (Search-R1's PPO)
      check("rl.group_size", self.group_size, *positive_integer())
    else:
      check("rl.group_size", self.group_size, lambda v: isinstance(v, int) and v >= 2, "group advantages need >= 2")
    check("rl.mini_batch_size", self.mini_batch_size,
          lambda v: isinstance(v, int) and not isinstance(v, bool) and (v == 0 or (v <= self.prompts_per_step
                                                                                  and self.prompts_per_step % v == 0)),
          f"0 (= prompts_per_step) or a divisor of prompts_per_step={self.prompts_per_step}")
    check("rl.micro_batch_tokens", self.micro_batch_tokens,
          lambda v: isinstance(v, int) and not isinstance(v, bool) and (v == 0 or v > self.max_new_tokens),
          f"0 (off) or a token budget above max_new_tokens={self.max_new_tokens} (a prompt and its completion)")
    check("rl.micro_batch_size", self.micro_batch_size, *non_negative_int(" (0 = off)"))
    if self.micro_batch_size and self.micro_batch_tokens:
      raise ConfigError(f"config.rl.micro_batch_size={self.micro_batch_size} and config.rl.micro_batch_tokens="
                        f"{self.micro_batch_tokens}: set one of them (rows or packed tokens a micro-batch), the "
                        "other 0")
    check("rl.old_logp", self.old_logp, *choice(("auto", "recompute")))
    check("rl.skip_grad_bound", self.skip_grad_bound, *interval(0.0, INF))
    check("rl.importance", self.importance, *choice(("auto",) + IS_MODES))
    check("rl.importance_level", self.importance_level, *choice(IS_LEVELS))
    check("rl.importance_cap", self.importance_cap, *interval(1.0, INF, lo_open=True))
    check("rl.async_steps", self.async_steps, *non_negative_int(" (0 = synchronous)"))
    object.__setattr__(self, "importance", resolve_importance(self.importance, self.async_steps))
    if self.importance_level == "sequence" and self.micro_batch_tokens:
      raise ConfigError(f"config.rl.importance_level='sequence' with config.rl.micro_batch_tokens="
                        f"{self.micro_batch_tokens}: packed rows split sequences; use importance_level=token or "
                        "micro_batch_tokens=0")
    check("rl.temperature", self.temperature, *interval(0.0, INF, lo_open=True))
    check("rl.top_p", self.top_p, *interval(0.0, 1.0, lo_open=True))
    check("rl.epsilon_low", self.epsilon_low, *interval(0.0, 1.0, hi_open=True))
    check("rl.epsilon_high", self.epsilon_high, *interval(0.0, INF))
    check("rl.dual_clip", self.dual_clip, lambda v: v == 0 or v > 1, "0 (off) or a constant > 1")
    check("rl.beta", self.beta, *interval(0.0, INF))
    check("rl.entropy_coef", self.entropy_coef, *interval(0.0, INF))
    check("rl.overlong_buffer", self.overlong_buffer, *non_negative_int(" (0 = off)"))
    check("rl.max_refill_rounds", self.max_refill_rounds, *non_negative_int())
    check("rl.sft_steps", self.sft_steps, *non_negative_int(" (0 = no SFT phase)"))
    check("rl.decode_impl", self.decode_impl, *choice(("scan", "unrolled", "auto")))
    for key in ("clip", "dense_rollouts", "mask_truncated", "dynamic_sampling"):
      check(f"rl.{key}", getattr(self, key), lambda v: isinstance(v, bool), "true or false")
    if entry.section and getattr(self, entry.section, None) is None:
      raise ConfigError(f"config.rl.{entry.section} is missing: objective {self.objective!r} needs its section "
                        f"(use the config's :{self.objective} preset)")
    entry.check(self)

  def __getattr__(self, name: str):
    """A key of config.rl not declared as a field (read by an added objective's kwargs)."""
    extra = self.__dict__.get("extra", {})
    if name in extra:
      return extra[name]
    raise AttributeError(f"config.rl has no field {name!r}")

  @property
  def objective_entry(self) -> Objective:
    """The objective's entry of `fineflax.rl.objectives.OBJECTIVES` (loss, batch fields, off-policy rows)."""
    return get_objective(self.objective)


def validate_rl(rl) -> Objective:
  """Check every field of `config.rl` (`RLConfig`); returns the objective's table entry."""
  return RLConfig.from_config(rl).objective_entry
