"""Search-R1 (Jin et al. 2025) as released, knob for knob: presets `ppo` (the default: the paper's main
results) and `grpo`.

Sources: `train_ppo.sh` and `train_grpo.sh` of github.com/PeterGriffinJin/Search-R1, last changed in commit
ba78b68eb48bddfbe83880ff3273bb14adba718f (2025-04-09; read at HEAD a14dc3a4ffc6fe88c1e95038d9738e21ba3f7a06),
with the defaults of `verl/trainer/config/ppo_trainer.yaml` (commit 18f40a090ac69012fd39406c143e8c4f186875e3:
clip_ratio 0.2, entropy_coeff 0.001, rollout top_p 0.95, gamma 1.0, lam 1.0, kl_penalty kl, cliprange_value
0.5, grad_clip 1.0, ppo_epochs 1) and `verl/workers/fsdp_workers.py` (AdamW betas (0.9, 0.999), weight_decay
1e-2; actor and critic in float32 under bf16 mixed precision; warmup = int(ratio x total_training_steps)
scheduler steps, one per rollout batch). The policy loss is verl's masked mean over a micro-batch's tokens
(`core_algos.compute_policy_loss`): agg_mode token-mean. Models: each script's active BASE_MODEL
(meta-llama/Llama-3.2-3B for PPO, Qwen/Qwen2.5-3B for GRPO); the commented alternatives (Qwen/Qwen2.5-3B,
Qwen/Qwen2.5-7B, meta-llama/Llama-3.1-8B, their -Instruct) plan the same way (`--config.model.source=...`).
The README's "Paper recipes" table maps every flag to its key here (tests/test_paper_configs.py checks it).

  python launch.py --config configs/papers/search_r1.py:ppo --dry_run --devices 8 --device_memory_gb 80
  python -m retrieval.server ... --port 8000, then python launch.py --config configs/papers/search_r1.py:grpo
Not supported: questions from the papers' nq_search parquet with search rollouts (data.train_files): the
search_r1 environment draws its questions from the generated knowledge base (the dataset environment reads
the parquet but rolls out single-turn), while the search tool is the paper's retriever at retriever.url;
prompts are not cut to max_start_length / max_prompt_length (plan.prompt_tokens plans for the start); no CPU
offload (the plan shows what fits without it), no separate log-prob or critic micro-batch sizes, no vLLM
gpu_memory_utilization.
"""
from configs import common
from configs import search_r1 as search_r1_toy
from configs.papers import verl

SHARED_FLAGS = (  # flags both scripts set to the same value
    "data.train_files", "data.val_files", "data.train_data_num", "data.val_data_num", "data.train_batch_size",
    "data.val_batch_size", "data.max_prompt_length", "data.max_response_length", "data.max_start_length",
    "data.max_obs_length", "data.shuffle_train_dataloader", "actor_rollout_ref.model.path",
    "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.model.use_remove_padding", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
    "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size",
    "actor_rollout_ref.actor.fsdp_config.param_offload", "actor_rollout_ref.actor.fsdp_config.grad_offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload", "actor_rollout_ref.rollout.log_prob_micro_batch_size",
    "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.ref.log_prob_micro_batch_size",
    "actor_rollout_ref.ref.fsdp_config.param_offload", "actor_rollout_ref.rollout.temperature",
    "actor_rollout_ref.actor.state_masking", "algorithm.no_think_rl", "trainer.logger", "trainer.val_only",
    "trainer.val_before_train", "trainer.default_hdfs_dir", "trainer.n_gpus_per_node", "trainer.nnodes",
    "trainer.save_freq", "trainer.test_freq", "trainer.project_name", "trainer.experiment_name",
    "trainer.total_epochs", "trainer.total_training_steps", "trainer.default_local_dir", "max_turns",
    "retriever.url", "retriever.topk")
PPO_FLAGS = ("algorithm.adv_estimator", "actor_rollout_ref.rollout.n_agent", "critic.optim.lr",
             "critic.model.use_remove_padding", "critic.optim.lr_warmup_steps_ratio", "critic.model.path",
             "critic.model.enable_gradient_checkpointing", "critic.ppo_micro_batch_size",
             "critic.model.fsdp_config.param_offload", "critic.model.fsdp_config.grad_offload",
             "critic.model.fsdp_config.optimizer_offload", "algorithm.kl_ctrl.kl_coef", "trainer.critic_warmup")
GRPO_FLAGS = ("algorithm.adv_estimator", "actor_rollout_ref.rollout.n_agent", "actor_rollout_ref.actor.use_kl_loss",
              "actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.kl_loss_type")
SCRIPT_FLAGS = {"ppo": SHARED_FLAGS + PPO_FLAGS, "grpo": SHARED_FLAGS + GRPO_FLAGS}

STEPS = 1005  # trainer.total_training_steps
UPDATES_PER_BATCH = 2  # train_batch_size 512 / ppo_mini_batch_size 256


def _ppo(config):
  """train_ppo.sh: GAE with a full critic, KL to the reference in the reward."""
  import ml_collections
  config.model.source = "meta-llama/Llama-3.2-3B"  # BASE_MODEL (the script's active line)
  r = config.rl
  r.objective = "ppo"  # algorithm.adv_estimator=gae
  r.group_size = 1  # rollout.n_agent=1
  r.beta = 0.0  # use_kl_loss False (yaml default): the KL goes into the reward
  r.advantage_scale = "none"  # GAE advantages (verl whitens them over the batch: not supported)
  r.ppo = p = ml_collections.ConfigDict()
  p.critic = "full"  # critic.model.path=$BASE_MODEL: a value head on a full copy of the base
  p.critic_lr = 1e-5  # critic.optim.lr
  p.critic_warmup_steps = int(0.015 * STEPS) * UPDATES_PER_BATCH  # critic.optim.lr_warmup_steps_ratio=0.015
  p.cliprange_value = 0.5  # critic.cliprange_value (yaml default)
  p.gamma = 1.0  # algorithm.gamma (yaml default)
  p.lam = 1.0  # algorithm.lam (yaml default)
  p.kl_in_reward = True  # algorithm.kl_ctrl (fixed): r_t -= kl_coef * KL_t
  p.kl_coef = 0.001  # algorithm.kl_ctrl.kl_coef
  p.kl_penalty = "kl"  # algorithm.kl_penalty (yaml default): logp - ref_logp
  p.value_loss_coef = 1.0  # the critic has its own optimizer: 0.5 * clipped squared error, unscaled


def _grpo(config):
  """train_grpo.sh: group advantages over 5 rollouts a question, k3 KL loss 0.001."""
  config.model.source = "Qwen/Qwen2.5-3B"  # BASE_MODEL (the script's active line)
  r = config.rl
  r.objective = "grpo"  # algorithm.adv_estimator=grpo
  r.group_size = 5  # rollout.n_agent=5
  r.beta = 0.001  # use_kl_loss=true, kl_loss_coef=0.001, kl_loss_type=low_var_kl (k3)
  r.advantage_scale = "group"  # compute_grpo_outcome_advantage: (score - mean) / (std + eps) per group


PRESETS = {"ppo": _ppo, "grpo": _grpo}


def get_config(arg: str = ""):
  config = search_r1_toy.get_config("grpo_only")  # env search_r1, its KB, search and reward sections
  config.model.remat = "full"  # enable_gradient_checkpointing=true (actor and critic)
  verl.actor(config)  # FSDP actor: full parameters, f32 master weights, bf16 compute
  config.mesh.update(data=-1, fsdp=8)  # n_gpus_per_node=8, nnodes=1
  common.plan(config, prompt_tokens=2048)  # data.max_start_length=2048 (the first prompt)
  config.num_steps = STEPS  # trainer.total_training_steps=1005 (total_epochs=15 is not reached first)
  config.eval_every = 50  # trainer.test_freq
  config.eval_at_start = True  # +trainer.val_before_train=true
  config.eval_batch_size = 256  # data.val_batch_size
  del config.checkpoint["every"]  # its own value: not tied to eval_every
  config.checkpoint.every = 100  # trainer.save_freq

  s = config.search
  s.url = "http://127.0.0.1:8000/retrieve"  # retriever.url (the paper's e5 retriever server)
  s.topk = 3  # retriever.topk
  s.max_turns = 2  # max_turns: turns that may search before the final answer turn
  s.max_turn_tokens = 500  # data.max_response_length: new tokens per model turn
  s.max_obs_tokens = 500  # data.max_obs_length: retrieved block cut to this many tokens
  s.mask_info = True  # actor.state_masking=true: <information> blocks out of the loss
  config.rewards.search_r1_em = 1.0  # qa_em.compute_score_em: exact match of the final answer
  config.rewards.search_r1_format = 0.0  # format_score 0.0 (compute_score_em default)

  r = config.rl
  r.prompts_per_step = 512  # data.train_batch_size
  r.mini_batch_size = 256  # ppo_mini_batch_size: 2 optimizer steps a rollout batch
  # ppo_micro_batch_size=64 over 8 GPUs = 8 rows a GPU; fineflax bounds a micro-batch by tokens: 8 rows of at
  # most 2048 + 2500 tokens
  r.micro_batch_tokens = 8 * (2048 + 2500)
  r.max_new_tokens = 2500  # (max_turns + 1) turns x 500 + max_turns x 500 retrieved tokens (<= 4096 + 500 - 2048)
  r.temperature = 1.0  # rollout.temperature=1
  r.top_p = 0.95  # rollout.top_p (yaml default)
  r.num_iterations = 1  # ppo_epochs (yaml default)
  r.clip = True  # verl's clipped surrogate
  r.epsilon_low = 0.2  # clip_ratio (yaml default)
  r.epsilon_high = 0.2  # clip_ratio
  r.entropy_coef = 0.001  # entropy_coeff (yaml default)
  r.agg_mode = "token-mean"  # masked mean over the micro-batch's tokens
  r.mask_truncated = False  # no truncation masking in verl
  # actor.optim.lr=1e-6, lr_warmup_steps_ratio=0.285: int(0.285 x 1005) = 286 rollout batches of 2 updates
  verl.adamw(config, learning_rate=1e-6, warmup_steps=int(0.285 * STEPS) * UPDATES_PER_BATCH,
             optimizer_steps=config.get_ref("num_steps") * UPDATES_PER_BATCH)
  named = [a.strip() for a in (arg or "").split(",") if a.strip()]
  if not any(n in PRESETS for n in named):
    named.insert(0, "ppo")  # the paper's main recipe
  return common.apply_presets(config, ",".join(named), PRESETS)
