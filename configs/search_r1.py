"""Search-R1 on a generated knowledge base with SmolLM2-135M-Instruct + QLoRA (GRPO, or LUFFY with demos).

  python launch.py --config configs/search_r1.py --workdir runs/search_r1               # GPU run
  python launch.py --config configs/search_r1.py:smoke --workdir runs/search_r1_smoke   # CPU smoke test
  Plain GRPO (no demonstrations): --config.rl.objective=grpo --config.rl.n_off=0
  External retriever: python -m retrieval.server --corpus kb.jsonl --kind bm25 --port 8000, then
  --config.search.url=http://127.0.0.1:8000/retrieve
"""
import ml_collections


def get_config(variant: str = ""):
  config = ml_collections.ConfigDict()
  config.job = "search_r1"  # fineflax.jobs.search_r1
  config.seed = 0  # PRNG seed: LoRA init, question order, sampling
  config.num_steps = ml_collections.FieldReference(30)  # rollout batches, each followed by num_iterations updates
  config.eval_every = 15  # steps between held-out evaluations (and checkpoints)
  config.eval_at_start = True  # evaluate the untrained model at step 0
  config.eval_batch_size = 128  # questions per greedy evaluation batch
  config.num_eval = 128  # held-out questions (half two-hop)

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

  config.rewards = ml_collections.ConfigDict()
  config.rewards.em = 1.0  # weight of exact match of the final answer (the Search-R1 reward)
  config.rewards.format = 0.1  # weight of the well-formed-trace reward
  config.rewards.search = 0.0  # weight of the searched-at-least-once bonus

  config.rl = ml_collections.ConfigDict()
  config.rl.prompts_per_step = 16  # questions per rollout batch
  config.rl.group_size = 5  # rows per question (G), demonstrations included
  config.rl.objective = "luffy"  # grpo or luffy (demonstration rows with the policy-shaping loss)
  config.rl.n_off = 1  # LUFFY: demonstration rows per group
  config.rl.luffy_gamma = 0.1  # LUFFY policy shaping f(p) = p / (p + gamma)
  config.rl.exgrpo_beta = 0.1  # (unused here; read by the shared Trainer)
  config.rl.exgrpo_sigma = 1.0  # (unused here; read by the shared Trainer)
  config.rl.max_new_tokens = 448  # completion budget per row: generated + inserted tokens
  config.rl.temperature = 1.0  # sampling temperature for rollouts
  config.rl.top_p = 1.0  # nucleus sampling mass for rollouts
  config.rl.num_iterations = ml_collections.FieldReference(1)  # updates per rollout batch (mu)
  config.rl.clip = True  # clipped surrogate (False: -r*A, LUFFY's released code)
  config.rl.epsilon_low = 0.2  # clip range below 1
  config.rl.epsilon_high = 0.2  # clip range above 1 (DAPO clip-higher: 0.28)
  config.rl.dual_clip = 0.0  # dual-clip constant c for A < 0 (0 = off)
  config.rl.beta = 0.0  # k3 KL coefficient to the LoRA-off reference (GRPO paper: 0.04)
  config.rl.entropy_coef = 0.0  # entropy bonus coefficient
  config.rl.agg_mode = "token-mean"  # seq-mean-token-mean, token-mean or sum
  config.rl.advantage_scale = "group"  # group, batch or none (Dr. GRPO)

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.num_steps = (config.get_ref("num_steps")  # optimizer updates (follows num_steps)
                                * config.rl.get_ref("num_iterations"))
  config.optimizer.learning_rate = 3e-4  # peak learning rate (LoRA)
  config.optimizer.warmup_steps = 3  # linear warmup
  config.optimizer.end_lr_ratio = 1.0  # constant after warmup
  config.optimizer.weight_decay = 0.0  # AdamW weight decay
  config.optimizer.b1 = 0.9  # Adam beta1
  config.optimizer.b2 = 0.99  # Adam beta2
  config.optimizer.grad_clip = 1.0  # global-norm clip

  if variant == "smoke":  # well under a minute on a CPU: tiny KB and batches, short turns
    config.model.dtype = "float32"
    config.model.quant = "none"
    config.num_steps = 1
    config.eval_every = 1
    config.eval_at_start = False
    config.eval_batch_size = 2
    config.num_eval = 2
    config.kb.num_people = 12
    config.kb.num_cities = 6
    config.kb.num_countries = 3
    config.search.max_turns = 2
    config.search.max_turn_tokens = 8
    config.search.max_obs_tokens = 48
    config.rl.prompts_per_step = 1
    config.rl.group_size = 2
    config.rl.max_new_tokens = 64
  elif variant:
    raise ValueError(f"unknown variant {variant!r} (known: smoke)")
  return config
