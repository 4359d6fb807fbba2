"""GRPO on generated arithmetic word problems with SmolLM2-135M-Instruct + QLoRA.

  python launch.py --config configs/grpo_arith.py --workdir runs/grpo_arith          # GPU run
  python launch.py --config configs/grpo_arith.py:smoke --workdir runs/grpo_smoke    # CPU smoke test
  The defaults are the DAPO-style settings of experiments/grpo_arith/RESULTS.md (token-mean loss,
  clip-higher 0.28, truncated completions masked, rollouts at T=0.7, lr 5e-4).
  LUFFY: --config.rl.objective=luffy (n_off solver traces in each group); ExGRPO:
  --config.rl.objective=exgrpo; DAPO dynamic sampling: --config.rl.dynamic_sampling=True; plain GRPO:
  --config.rl.agg_mode=seq-mean-token-mean --config.rl.epsilon_high=0.2 --config.rl.mask_truncated=False;
  Dr. GRPO: --config.rl.agg_mode=sum --config.rl.advantage_scale=none
"""
import ml_collections


def get_config(variant: str = ""):
  config = ml_collections.ConfigDict()
  config.job = "grpo"  # fineflax.jobs.grpo
  config.seed = 0  # PRNG seed: LoRA init, problem order, sampling
  config.num_steps = ml_collections.FieldReference(60)  # rollout batches, each followed by num_iterations updates
  config.eval_every = 10  # steps between held-out evaluations (and checkpoints)
  config.eval_batch_size = 128  # prompts per greedy evaluation batch

  config.model = ml_collections.ConfigDict()
  config.model.source = "smollm2-135m-instruct"  # HF folder, .gguf file, hub name or alias
  config.model.dtype = "bfloat16"  # compute dtype
  config.model.quant = "nf4"  # frozen base: nf4 (QLoRA), int8 or none
  config.model.remat = "none"  # gradient checkpointing policy: none, full or dots
  config.model.logits_chunk = 128  # tokens per chunk of the vocabulary projection

  config.lora = ml_collections.ConfigDict()
  config.lora.r = 16  # adapter rank
  config.lora.alpha = 32.0  # scale alpha / r
  config.lora.dropout = 0.0  # no dropout in RL (log-probs must match the sampler's)
  config.lora.rslora = False  # alpha / sqrt(r) scaling
  config.lora.targets = ("q", "k", "v", "o", "gate", "up", "down")  # adapted linears

  config.task = ml_collections.ConfigDict()
  config.task.num_train = 4000  # distinct training problems
  config.task.num_eval = 256  # held-out problems (disjoint split)
  config.task.num_steps = (1, 2)  # operations per problem (inclusive range, 1..5)
  config.task.max_start = 20  # start counts are drawn from [2, max_start]
  config.task.max_addend = 10  # "gets x more" draws x from [1, max_addend]
  config.task.eval_seed = 10_000  # seed of the held-out problems (another seed = another validation set)
  config.task.assistant_prefix = ""  # text the assistant turn starts with (e.g. "<think>\n"); part of the prompt
  config.task.system_prompt = (  # instruction given with every question
      "Solve the word problem step by step. End with the final number, like: The answer is 42.")
  config.task.accuracy_reward = "math_last_number"  # reward that defines held-out accuracy

  config.rewards = ml_collections.ConfigDict()
  config.rewards.math_last_number = 1.0  # weight of answer correctness (<answer>/boxed, else last number)

  config.rl = ml_collections.ConfigDict()
  config.rl.prompts_per_step = 32  # questions per rollout batch
  config.rl.group_size = 8  # completions per question (G)
  config.rl.objective = "grpo"  # grpo (incl. DAPO / Dr. GRPO settings), luffy or exgrpo
  config.rl.n_off = 1  # LUFFY: off-policy solver traces per group
  config.rl.traces_path = ""  # LUFFY traces file (JSON/JSONL/Parquet); "" = the task solver's solutions
  config.rl.luffy_gamma = 0.1  # LUFFY policy shaping f(p) = p / (p + gamma)
  config.rl.exgrpo_beta = 0.1  # ExGRPO importance-weight shaping w / (w + beta)
  config.rl.exgrpo_sigma = 1.0  # ExGRPO Gaussian bucket weights N(k; K/2, sigma)
  config.rl.exgrpo_threshold = 0.35  # ExGRPO: replay once the batch solve rate passes this
  config.rl.experience_share = 0.5  # ExGRPO: share of each batch's questions taken from the buffer
  config.rl.max_new_tokens = 128  # completion budget
  config.rl.temperature = 0.7  # rollout temperature; the loss uses the same softmax(logits / T)
  config.rl.top_p = 1.0  # nucleus sampling mass for rollouts
  config.rl.num_iterations = ml_collections.FieldReference(1)  # updates per rollout batch (mu)
  config.rl.clip = True  # clipped surrogate (False: -r*A, LUFFY's released code)
  config.rl.epsilon_low = 0.2  # clip range below 1
  config.rl.epsilon_high = 0.28  # clip range above 1 (DAPO clip-higher; GRPO: 0.2)
  config.rl.dual_clip = 0.0  # dual-clip constant c for A < 0 (0 = off)
  config.rl.beta = 0.0  # k3 KL coefficient to the LoRA-off reference (GRPO paper: 0.04)
  config.rl.entropy_coef = 0.0  # entropy bonus coefficient
  config.rl.agg_mode = "token-mean"  # seq-mean-token-mean (GRPO), token-mean (DAPO) or sum (Dr. GRPO)
  config.rl.advantage_scale = "group"  # group, batch or none (Dr. GRPO)
  config.rl.mask_truncated = True  # zero the loss of completions cut at max_new_tokens (DAPO)
  config.rl.overlong_buffer = 0  # DAPO soft overlong punishment over the last N tokens (0 = off)
  config.rl.dynamic_sampling = False  # DAPO: drop zero-variance groups and refill
  config.rl.max_refill_rounds = 2  # extra rollout rounds allowed for refilling

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.num_steps = (config.get_ref("num_steps")  # optimizer updates (follows num_steps)
                                * config.rl.get_ref("num_iterations"))
  config.optimizer.learning_rate = 5e-4  # peak learning rate (LoRA)
  config.optimizer.warmup_steps = 5  # linear warmup
  config.optimizer.end_lr_ratio = 1.0  # constant after warmup
  config.optimizer.weight_decay = 0.0  # AdamW weight decay
  config.optimizer.b1 = 0.9  # Adam beta1
  config.optimizer.b2 = 0.99  # Adam beta2
  config.optimizer.grad_clip = 1.0  # global-norm clip

  if variant == "smoke":  # seconds on a CPU: tiny batches, short completions
    config.model.dtype = "float32"
    config.num_steps = 2
    config.eval_every = 2
    config.eval_batch_size = 8
    config.task.num_eval = 8
    config.rl.prompts_per_step = 2
    config.rl.group_size = 4
    config.rl.max_new_tokens = 24
  elif variant:
    raise ValueError(f"unknown variant {variant!r} (known: smoke)")
  return config
