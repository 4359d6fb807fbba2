"""LUFFY (Yan et al. 2025, "Learning to Reason under Off-Policy Guidance") as released, knob for knob.

Source: `exp_scripts/train.sh` of github.com/ElliottYan/LUFFY, last changed in commit
35ccd28f5a87802b62f72568e2e0d3d6cebdd923 (2025-04-21; read at HEAD 01f4ae066249e6965ce0d5512ccdf99a12895c74).
Knobs the script leaves unset come from `luffy/verl/verl/mix_src/config/mix_ppo_trainer.yaml` (clip_ratio 0.2,
grad_clip 1.0, top_p 1, ppo_epochs 1, constant lr without warmup) and `luffy/verl/verl/mix_src/mix_fsdp_worker.py`
(AdamW betas (0.9, 0.999), weight_decay 1e-2; the actor held in float32 under bf16 mixed precision).
The README's "Paper recipes" table maps every flag to its key here (tests/test_paper_configs.py checks it).

  python launch.py --config configs/papers/luffy.py --dry_run --devices 8 --device_memory_gb 80   # the plan
  python launch.py --config configs/papers/luffy.py --config.dataset.train=data/openr1.parquet \
      --config.dataset.eval=data/valid.parquet --workdir runs/luffy_paper                          # 8 GPUs
Without the paper's files the run reads the shipped LUFFY-format samples (fineflax/data/samples/).
Not supported (the script's value is what fineflax does anyway, or has no counterpart): prompts are not cut to
data.max_prompt_length (plan.prompt_tokens only plans for it), no tensor-parallel rollouts (rows and their KV
cache are split over the mesh), no CPU offload, no sequence parallelism, no gpu_memory_utilization (the KV
cache is sized for the batch; the plan checks the fit).
"""
from configs import common, dataset_rl
from configs.papers import verl

SCRIPT_FLAGS = (  # the flags of exp_scripts/train.sh, in order (the README table has a row for each)
    "algorithm.adv_estimator", "data.train_files", "data.val_files", "data.train_batch_size",
    "data.val_batch_size", "data.max_prompt_length", "data.max_response_length", "actor_rollout_ref.model.path",
    "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size",
    "actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.kl_loss_type",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size", "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.actor.fsdp_config.param_offload", "actor_rollout_ref.actor.fsdp_config.grad_offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload", "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.temperature",
    "actor_rollout_ref.rollout.val_temperature", "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.n_val", "actor_rollout_ref.ref.fsdp_config.param_offload",
    "actor_rollout_ref.rollout.max_prefix_len", "algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.entropy_coeff",
    "trainer.critic_warmup", "trainer.logger", "trainer.project_name", "trainer.experiment_name",
    "trainer.val_before_train", "trainer.n_gpus_per_node", "trainer.nnodes", "trainer.save_freq",
    "trainer.test_freq", "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.use_sft_prefix_reward",
    "actor_rollout_ref.rollout.prefix_share_across_samples", "actor_rollout_ref.rollout.prefix_strategy",
    "actor_rollout_ref.rollout.n_prefix", "actor_rollout_ref.rollout.min_prefix_ratio",
    "actor_rollout_ref.rollout.max_prefix_ratio", "actor_rollout_ref.rollout.prefix_reward_weight_alpha",
    "actor_rollout_ref.ref.use_ref", "actor_rollout_ref.actor.use_off_policy_loss",
    "actor_rollout_ref.actor.off_policy_normalize", "actor_rollout_ref.actor.off_policy_reshape",
    "actor_rollout_ref.actor.off_policy_loss_impl", "algorithm.grpo_use_std",
    "actor_rollout_ref.actor.loss_remove_token_mean", "actor_rollout_ref.actor.loss_remove_clip",
    "data.reward_impl_version", "trainer.max_optim_to_keep", "data.shuffle", "trainer.default_hdfs_dir",
    "trainer.total_epochs")


def get_config(arg: str = ""):
  config = dataset_rl.get_config("luffy")  # dataset env, LUFFY's parquet format, math_think reward, T=1.0 / 0.6
  config.model.source = "Elliott/Qwen2.5-Math-7B-16k-think"  # actor_rollout_ref.model.path
  config.model.remat = "full"  # enable_gradient_checkpointing=True
  verl.actor(config)  # FSDP actor: full parameters, f32 master weights, bf16 compute
  config.mesh.update(data=-1, fsdp=8)  # n_gpus_per_node=8, nnodes=1: FSDP over the 8 GPUs
  common.plan(config, prompt_tokens=1024)  # data.max_prompt_length=1024
  config.num_steps = 500  # total_epochs=30 in the script (stopped by hand): the paper trains 500 steps
  config.eval_every = 10  # trainer.test_freq
  config.eval_at_start = False  # +trainer.val_before_train=False
  config.eval_batch_size = 512  # data.val_batch_size
  del config.checkpoint["every"]  # its own value: not tied to eval_every
  config.checkpoint.every = 50  # trainer.save_freq
  config.checkpoint.keep_last = 2  # trainer.max_optim_to_keep

  r = config.rl
  r.prompts_per_step = 128  # data.train_batch_size
  r.group_size = 8  # rollout.n: 7 sampled rows + 1 trace (n_prefix=1)
  r.max_new_tokens = 8192  # data.max_response_length (traces are cut to it too: max_prefix_len=8192)
  r.temperature = 1.0  # rollout.temperature
  r.top_p = 1.0  # rollout.top_p (yaml default 1)
  r.num_iterations = 1  # ppo_epochs (yaml default 1)
  r.mini_batch_size = 64  # ppo_mini_batch_size: 128 / 64 = 2 optimizer steps a rollout batch
  r.micro_batch_tokens = 32768  # use_dynamic_bsz=True, ppo_max_token_len_per_gpu=32768
  r.beta = 0.0  # use_kl_loss=False, kl_loss_coef=0.00, ref.use_ref=False
  r.entropy_coef = 0.001  # entropy_coeff
  r.clip = False  # loss_remove_clip=True
  r.epsilon_low = 0.2  # clip_ratio (yaml default; unused without the clip)
  r.epsilon_high = 0.2  # clip_ratio
  r.agg_mode = "sum"  # loss_remove_token_mean=True: sum over tokens / max_len
  r.advantage_scale = "none"  # algorithm.grpo_use_std=False
  r.mask_truncated = False  # not in the script (no truncation masking)
  r.luffy.n_off = 1  # n_prefix=1 with min_prefix_ratio = max_prefix_ratio = 1.0: one whole trace a group
  r.luffy.gamma = 0.1  # off_policy_reshape="p_div_p_0.1": f(p) = p / (p + 0.1)
  r.luffy.shaping = True  # off_policy_reshape on (no_reshape: shaping=False)

  # actor.optim.lr=1e-6; lr_warmup_steps_ratio 0 (yaml default); 2 optimizer steps a rollout batch (128 / 64)
  verl.adamw(config, learning_rate=1e-6, warmup_steps=0, optimizer_steps=config.get_ref("num_steps") * 2)
  return common.apply_presets(config, arg, {})
