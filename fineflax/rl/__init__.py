"""RL objectives and data: losses, group advantages, ExGRPO experience, LUFFY traces, toy tasks."""
from fineflax.rl.advantages import dapo_overlong_penalty, group_advantages, zero_variance_groups
from fineflax.rl.experience import (ExperienceBuffer, Trajectory, experience_split, replay_active)
from fineflax.rl.losses import (AGG_MODES, aggregate, chunked_token_logp_and_entropy, clipped_surrogate,
                                entropy_from_logits, exgrpo_loss, exgrpo_replay_weight, grpo_loss, kl_k3,
                                luffy_loss, masked_mean, policy_shaping_loss, token_logp,
                                unclipped_surrogate)
from fineflax.rl.tasks import Problem, generate_problems, make_problem, solve, write_traces
from fineflax.rl.traces import Trace, TraceFormatError, filter_traces, load_traces, parse_record
