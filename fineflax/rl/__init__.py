"""RL objectives and data: losses, the objective table, group advantages, ExGRPO experience, LUFFY traces."""
from fineflax.rl.advantages import dapo_overlong_penalty, group_advantages, zero_variance_groups
from fineflax.rl.experience import (ExperienceBuffer, Trajectory, experience_split, replay_active)
from fineflax.rl.losses import (AGG_MODES, aggregate, clipped_surrogate, exgrpo_loss, exgrpo_replay_weight,
                                grpo_loss, kl_k3, luffy_loss, masked_mean, policy_shaping_loss,
                                unclipped_surrogate)
from fineflax.rl.config import ExGRPOConfig, LuffyConfig, RLConfig, validate_rl
from fineflax.rl.objectives import OBJECTIVES, Objective, get_objective
from fineflax.rl.traces import Trace, TraceFormatError, filter_traces, load_traces, parse_record
