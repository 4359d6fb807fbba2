"""Config sections shared by the recipes (big_vision style) and the presets picked by `--config FILE:a,b`.

Each helper adds one commented section to a ConfigDict; a recipe's `get_config(arg)` builds its config
from them and then applies the presets named in `arg` (comma-separated, in order) with `apply_presets`.
"""
import ml_collections

LINEARS = ("q", "k", "v", "o", "gate", "up", "down")


def model(config, source="smollm2-135m-instruct", dtype="auto", quant="nf4", remat="none",
          logits_chunk=128):
  config.model = ml_collections.ConfigDict()
  config.model.source = source  # HF folder, .gguf file, hub name or alias
  config.model.dtype = dtype  # compute dtype: auto (bfloat16 on GPU/TPU, float32 on CPU), float32 or bfloat16
  config.model.quant = quant  # frozen base linears: nf4 (QLoRA), int8 or none (plain LoRA)
  config.model.quant_targets = ("all-linear",)  # quantised linears: short/HF names or all-linear
  config.model.remat = remat  # per-layer gradient checkpointing: none, full, dots, offload (full, with
  #   the per-layer inputs kept in pinned host memory: fineflax.models.remat), or a policy by name: attn (q/k/v
  #   and attention output kept), matmuls (every projection and the attention output kept) or save:NAME,...
  config.model.logits_chunk = logits_chunk  # tokens per chunk of the vocabulary projection in the loss
  config.model.attention = "auto"  # attention kernel: auto (cuDNN for bf16 on GPU), cudnn or xla
  config.model.layer_loop = "auto"  # layers as lax.scan over stacked weights ("scan"), a Python loop with no
  #   [L, ...] residual stacks ("unrolled": longer compile), or "auto": unrolled on GPUs with remat none,
  #   else scan (measured: layer_loop.resolve_layer_loop)
  return config


def lora(config, r=16, alpha=32.0, dropout=0.0, targets=LINEARS):
  config.lora = ml_collections.ConfigDict()
  config.lora.r = r  # adapter rank
  config.lora.alpha = alpha  # scale = alpha / r (alpha / sqrt(r) with rslora)
  config.lora.dropout = dropout  # dropout on the adapter input (0 in RL: log-probs must match the sampler's)
  config.lora.rslora = False  # rank-stabilised scaling
  config.lora.targets = targets  # adapted linears: short names (q ... down), HF names (q_proj) or all-linear
  config.lora.init_from = ""  # PEFT folder whose LoRA training starts from (same r/alpha/targets); "" = fresh
  return config


def train(config, params="lora", master_dtype="bfloat16", micro_batch_tokens=0, moment_dtype="float32"):
  """What the job trains (fineflax/train/trainable.py) and how SFT / distillation steps run (fineflax.train)."""
  config.train = ml_collections.ConfigDict()
  config.train.params = params  # lora (adapters on the frozen base, the default) or full (every parameter;
  #   needs model.quant=none; params and AdamW state split over mesh.fsdp; the export is a merged HF folder)
  config.train.master_dtype = master_dtype  # full: bfloat16 (bf16 params, AdamW moments as moment_dtype) or float32
  #   (f32 master params, computed in model.dtype)
  config.train.moment_dtype = moment_dtype  # AdamW mu and nu stored in float32 or bfloat16 (half the optimizer
  #   bytes, as torch keeps them for bf16 params; computed in float32 either way: fineflax.train.optim)
  config.train.loss_head = "chunked"  # SFT loss: chunked (a trained head's backward recomputes the logits) or
  #   fused (the head's gradients made in the forward pass, the logits once: fineflax.models.logprobs)
  config.train.micro_batch_tokens = micro_batch_tokens  # SFT token budget per device per micro-batch: the
  #   step's sequences re-packed into rows of this many tokens, gradients accumulated; 0 = data.grad_accum batches.
  #   Distillation: as many of the step's padded rows per device per micro-batch as fit; 0 = the whole batch
  return config


def optimizer(config, num_steps, learning_rate, warmup_steps, end_lr_ratio=1.0, b2=0.99):
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.num_steps = num_steps  # optimizer updates
  config.optimizer.learning_rate = learning_rate  # peak learning rate (LoRA)
  config.optimizer.warmup_steps = warmup_steps  # linear warmup
  config.optimizer.end_lr_ratio = end_lr_ratio  # cosine decays to this fraction of the peak (1 = constant)
  config.optimizer.weight_decay = 0.0  # AdamW decoupled weight decay
  config.optimizer.b1 = 0.9  # Adam beta1
  config.optimizer.b2 = b2  # Adam beta2
  config.optimizer.grad_clip = 1.0  # global-norm clip; 0 = off
  return config


def checkpoint(config, every, keep_last=2, keep_best=1):
  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.every = every  # steps between checkpoints (evaluations and the last step always save)
  config.checkpoint.keep_last = keep_last  # most recent checkpoints kept
  config.checkpoint.keep_best = keep_best  # best-by-evaluation checkpoints kept
  config.resume = True  # False: move an earlier run in the workdir aside and start afresh
  return config


def mesh(config, data=-1, fsdp=1, model=1):
  """Where the run computes: the device mesh over every visible device (of every process) and the
  jax.distributed settings of a multi-process run (fineflax.train.distributed)."""
  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = data  # data-parallel devices (-1: all that fsdp leaves)
  config.mesh.fsdp = fsdp  # devices the frozen base weights are split over
  config.mesh.model = model  # RL rollouts: devices one tensor-parallel engine splits the weights and KV
  #   pages over (1 = off; divides the devices, heads, kv heads and intermediate size; fineflax.rl.learner)
  config.mesh.rollout = 0  # async RL (rl.async_steps >= 1): the last N devices decode the rollouts while the
  #   others train, weights copied device to device after each update (fineflax/rl/async_rollouts.py); 0 = none
  config.distributed = ml_collections.ConfigDict()
  config.distributed.coordinator_address = ""  # host:port of process 0; "" = from the environment or one process
  config.distributed.num_processes = 0  # processes of the run (0 = from the environment)
  config.distributed.process_id = -1  # this process's index (-1 = from the environment)
  return config


def search_r1_sections(config):
  """The generated knowledge base and the search tool of Search-R1 rollouts (fineflax/envs/search_r1.py)."""
  config.kb = ml_collections.ConfigDict()
  config.kb.num_people = 300  # people (each founds one company): 7 questions each
  config.kb.num_cities = 60  # cities (one question each)
  config.kb.num_countries = 12  # countries
  config.kb.test_fraction = 0.2  # share of anchor entities held out
  config.kb.seed = 0  # seed of names, facts and the split

  config.search = ml_collections.ConfigDict()
  config.search.engine = "bm25"  # in-process engine kind: bm25, vector or hybrid
  config.search.url = ""  # Search-R1 /retrieve URL; when set, used instead of the in-process engine
  config.search.topk = 3  # passages inserted per search
  config.search.timeout_s = 30.0  # a search call slower than this is reported as failed (0 = no limit)
  config.search.max_turns = 4  # turns that may search before the final (no-search) turn
  config.search.max_turn_tokens = 96  # new tokens per model turn
  config.search.max_obs_tokens = 192  # inserted information block cut to this many tokens
  config.search.info_tag = "information"  # tag of inserted passages (classic variant: context)
  config.search.mask_info = True  # inserted passages out of the loss (False: the paper's ablation)
  return config


def rl(config, *, prompts_per_step, group_size, max_new_tokens, temperature, objective="grpo"):
  """The settings every RL objective shares; objective-specific ones come with their preset."""
  config.rl = r = ml_collections.ConfigDict()
  r.objective = objective  # an entry of fineflax.rl.objectives.OBJECTIVES: grpo, luffy, exgrpo or ppo
  r.prompts_per_step = prompts_per_step  # questions per rollout batch
  r.group_size = group_size  # rows per question (G), off-policy rows included
  r.max_new_tokens = max_new_tokens  # completion budget per row
  r.temperature = temperature  # rollout temperature; the loss uses the same softmax(logits / T)
  r.top_p = 1.0  # nucleus sampling mass for rollouts
  r.decode_impl = "scan"  # rollout decoder: scan (each engine program compiles in ~2.5 s on an H200) or
  #   unrolled (~16 s a program, decodes 1.5-2x faster: pays off only in long runs; a 4-step Search-R1 run
  #   with unrolled had not finished its first evaluation when scan had finished the run, 2026-11-27) or
  #   auto (FINEFLAX_DECODE, else unrolled on GPUs)
  r.dense_rollouts = False  # rollouts decode a dense copy of a quantised base (same weights; NF4 decoding
  #   took 2.4-2.8x bf16's time on an H200), costing that copy's memory while sampling
  r.num_iterations = ml_collections.FieldReference(1)  # updates per rollout batch (mu)
  r.clip = True  # clipped surrogate (False: -r*A, LUFFY's released code)
  r.epsilon_low = 0.2  # clip range below 1
  r.epsilon_high = 0.28  # clip range above 1 (DAPO clip-higher; GRPO: 0.2)
  r.dual_clip = 0.0  # dual-clip constant c > 1 for A < 0 (0 = off)
  r.beta = 0.0  # k3 KL coefficient to the LoRA-off reference (GRPO paper: 0.04)
  r.entropy_coef = 0.0  # entropy bonus coefficient (token mean of the entropy, as LUFFY)
  r.agg_mode = "token-mean"  # token-mean (DAPO), seq-mean-token-mean (GRPO), seq-mean-token-sum-norm (Dr. GRPO), sum
  r.advantage_scale = "group"  # group, batch or none (Dr. GRPO, LUFFY)
  r.mask_truncated = False  # zero the loss of completions cut at max_new_tokens (DAPO)
  r.overlong_buffer = 0  # DAPO soft overlong punishment over the last N tokens (0 = off)
  r.dynamic_sampling = False  # DAPO: drop zero-variance groups and refill
  r.max_refill_rounds = 2  # extra rollout rounds allowed for refilling
  r.sft_steps = 0  # leading SFT steps on the demonstrations, then RL (fineflax/rl/sft_phase.py)
  r.mini_batch_size = 0  # prompts per optimizer step (verl ppo_mini_batch_size, whole groups): prompts_per_step /
  #   mini_batch_size steps per rollout batch and iteration; 0 = prompts_per_step (one step)
  r.micro_batch_size = 0  # rows per device per micro-batch of the update, padded as the whole batch (verl
  #   ppo_micro_batch_size_per_gpu without use_dynamic_bsz), gradients accumulated; 0 = off. Exclusive with:
  r.micro_batch_tokens = 0  # token budget per device per micro-batch of the update (verl ppo_max_token_len_per_gpu
  #   with use_dynamic_bsz): rows packed by length, gradients accumulated; 0 = off (one padded pass)
  r.old_logp = "auto"  # old log-probs of the ratio: auto = when the rollout batch gets exactly one optimizer
  #   step (num_iterations 1, one mini-batch, no critic) the current logp under stop_gradient (ratio 1, the same
  #   gradient; TRL / tunix skip that pass too), else recomputed; recompute = always one more forward
  r.skip_grad_bound = 0.0  # ExGRPO: a step whose global grad norm exceeds this (or is not finite) applies no
  #   update and logs skipped=1 (0 = off)
  r.importance = "auto"  # rollout importance correction of the policy gradient by r = pi_old / pi_rollout on
  #   on-policy tokens (fineflax/rl/importance.py): none, tis (weight min(r, C), Yao et al. 2025) or mis (weight
  #   r, 0 where r leaves [1/C, C]: slime's masked IS); auto = tis when async_steps >= 1 (uncorrected stale
  #   rollouts collapsed in experiments/async_rl), else none; the mismatch metrics are logged in every case
  r.importance_level = "token"  # token (r per token) or sequence (one r per row: exp of the row's summed log-ratio)
  r.importance_cap = 2.0  # C > 1 of tis / mis (Yao et al. 2025: C = 2)
  r.async_steps = 0  # k: rollouts may use weights up to k updates old, the next batch generated while the
  #   learner trains (fineflax/rl/async_rollouts.py; config.mesh.rollout devices decode apart); 0 = synchronous
  return config


def luffy_section(rl, n_off=1, gamma=0.1, shaping=True, traces_path=""):
  rl.luffy = ml_collections.ConfigDict()
  rl.luffy.n_off = n_off  # off-policy demonstration rows per group
  rl.luffy.gamma = gamma  # policy shaping f(p) = p / (p + gamma)
  rl.luffy.shaping = shaping  # False: the paper's no-shaping ablation (-A * p)
  rl.luffy.traces_path = traces_path  # traces file (JSON/JSONL/Parquet); "" = the environment's demonstrations
  return rl


def exgrpo_section(rl, beta=0.1, sigma=1.0, threshold=0.35, share=0.5, max_per_question=8):
  rl.exgrpo = ml_collections.ConfigDict()
  rl.exgrpo.beta = beta  # replay importance-weight shaping w / (w + beta)
  rl.exgrpo.sigma = sigma  # Gaussian bucket weights N(k; K/2, sigma)
  rl.exgrpo.threshold = threshold  # replay once the batch solve rate passes this
  rl.exgrpo.share = share  # share of each batch's questions taken from the buffer
  rl.exgrpo.max_per_question = max_per_question  # stored correct trajectories per question
  return rl


def ppo_section(rl, critic="lora", critic_lr=1e-5, critic_warmup_steps=0, cliprange_value=0.5, gamma=1.0, lam=1.0,
                kl_in_reward=True, kl_coef=0.001, kl_penalty="kl", value_loss_coef=1.0):
  rl.ppo = ml_collections.ConfigDict()
  rl.ppo.critic = critic  # value model: lora (its own LoRA + value head [H, 1] on the base) or full (a trainable copy)
  rl.ppo.critic_lr = critic_lr  # critic AdamW peak learning rate (verl critic.optim.lr)
  rl.ppo.critic_warmup_steps = critic_warmup_steps  # critic learning-rate warmup steps (verl critic.optim
  #   lr_warmup_steps_ratio x total steps); the rest of the schedule is config.optimizer's
  rl.ppo.cliprange_value = cliprange_value  # value clip around the old values (verl critic.cliprange_value)
  rl.ppo.gamma = gamma  # GAE discount (verl algorithm.gamma)
  rl.ppo.lam = lam  # GAE lambda (verl algorithm.lam)
  rl.ppo.kl_in_reward = kl_in_reward  # subtract kl_coef * KL(old || ref) per policy token from the reward
  #   (verl apply_kl_penalty, fixed kl_ctrl); rl.beta stays the k3 KL loss
  rl.ppo.kl_coef = kl_coef  # verl algorithm.kl_ctrl.kl_coef
  rl.ppo.kl_penalty = kl_penalty  # KL estimate in the reward: kl, abs, mse or low_var_kl (verl algorithm.kl_penalty)
  rl.ppo.value_loss_coef = value_loss_coef  # scale of the critic's loss (it has its own optimizer)
  return rl


def _grpo(c):  # the GRPO paper's loss
  c.rl.update(agg_mode="seq-mean-token-mean", epsilon_high=0.2, mask_truncated=False,
              dynamic_sampling=False, advantage_scale="group")


def _dapo(c):  # DAPO: token-mean, clip-higher, truncation masking, dynamic sampling
  c.rl.update(agg_mode="token-mean", epsilon_high=0.28, mask_truncated=True, dynamic_sampling=True,
              advantage_scale="group")


def _dr_grpo(c):  # Dr. GRPO: 1/B sum_b sum_t L / MAX (TRL's dr_grpo), no std scaling
  c.rl.update(agg_mode="seq-mean-token-sum-norm", advantage_scale="none")


def _luffy(c):  # LUFFY, official train.sh: no on-policy clip, sum / max_len, no std, entropy 0.001
  c.rl.update(objective="luffy", clip=False, agg_mode="sum", advantage_scale="none", entropy_coef=0.001)
  luffy_section(c.rl)


def _exgrpo(c):  # ExGRPO: replay of past successes once the solve rate passes 0.35
  c.rl.objective = "exgrpo"
  exgrpo_section(c.rl)


def _ppo(c):  # PPO with a LoRA critic and GAE (Search-R1's train_ppo.sh / verl defaults): token-mean, clip 0.2
  c.rl.update(objective="ppo", agg_mode="token-mean", epsilon_high=0.2, dynamic_sampling=False)
  ppo_section(c.rl)


RL_PRESETS = {"grpo": _grpo, "dapo": _dapo, "dr_grpo": _dr_grpo, "luffy": _luffy, "exgrpo": _exgrpo,
              "ppo": _ppo}


def apply_presets(config, arg: str, presets: dict):
  """Apply the presets named in `arg` ("luffy,smoke"), in order; an unknown name lists the known ones."""
  for name in [a.strip() for a in (arg or "").split(",") if a.strip()]:
    if name not in presets:
      raise ValueError(f"unknown preset {name!r}; known: {', '.join(presets)}")
    presets[name](config)
  return config


def plan(config, prompt_tokens=512):
  """What the memory plan (`fineflax.jobs.memory_plan`: `--dry_run` and the fit check at start) assumes beyond
  the config's own sizes."""
  config.plan = ml_collections.ConfigDict()
  config.plan.prompt_tokens = prompt_tokens  # prompt length planned for every rollout row (prompts are not cut to it)
  return config
