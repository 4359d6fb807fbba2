"""GRPO-family RL on generated arithmetic word problems with SmolLM2-135M-Instruct + QLoRA.

  python launch.py --config configs/grpo_arith.py --workdir runs/grpo_arith            # GPU run
  python launch.py --config configs/grpo_arith.py:smoke --workdir runs/grpo_smoke      # CPU smoke test
  Presets (comma-separated, applied in order): grpo (the GRPO paper's loss), dapo (+ dynamic sampling),
  dr_grpo, luffy (the paper's settings, solver traces as demonstrations), exgrpo, smoke;
  e.g. configs/grpo_arith.py:luffy,smoke. The defaults are DAPO's loss without dynamic sampling
  (token-mean, clip-higher 0.28, truncated completions masked, T=0.7, lr 5e-4:
  experiments/grpo_arith/RESULTS.md).
"""
import ml_collections

from configs import common


def _smoke(config):
  """CPU smoke test (tiny batches, short completions): 573 s with SmolLM2-135M on 2 CPU cores shared with other jobs
  (load 8-11), 2026-11-27."""
  config.model.dtype = "float32"
  config.num_steps = 2
  config.eval_every = 2
  config.eval_batch_size = 8
  config.task.num_eval = 8
  config.rl.prompts_per_step = 2
  config.rl.group_size = 4
  config.rl.max_new_tokens = 24


PRESETS = {**common.RL_PRESETS, "smoke": _smoke}


def get_config(arg: str = ""):
  config = ml_collections.ConfigDict()
  config.job = "rl"  # fineflax.jobs.rl
  config.env = "arithmetic"  # fineflax.envs: the task plug-in (prompts, rewards, evaluation)
  config.seed = 0  # PRNG seed: LoRA init, problem order, sampling
  config.num_steps = ml_collections.FieldReference(60)  # rollout batches, each followed by num_iterations updates
  config.eval_every = ml_collections.FieldReference(10)  # steps between held-out evaluations
  config.eval_at_start = True  # evaluate the untrained model at step 0
  config.eval_batch_size = 128  # prompts per greedy evaluation batch

  common.model(config, quant="nf4", logits_chunk=128)
  common.lora(config, r=16, alpha=32.0, dropout=0.0)
  common.train(config)  # what is trained: lora (default) or full
  common.checkpoint(config, every=config.get_ref("eval_every"))
  common.mesh(config)

  config.task = ml_collections.ConfigDict()
  config.task.num_train = 4000  # distinct training problems
  config.task.num_eval = 256  # held-out problems (disjoint split)
  config.task.num_steps = (1, 2)  # operations per problem (inclusive range, 1..5)
  config.task.max_start = 20  # start counts are drawn from [2, max_start]
  config.task.max_addend = 10  # "gets x more" draws x from [1, max_addend]
  config.task.eval_seed = 10_000  # seed of the held-out problems (tune on task.eval_split=validation: disjoint
  #   from the test problems; another seed's held-out problems may share some with them)
  config.task.assistant_prefix = ""  # text the assistant turn starts with (e.g. "<think>\n"); part of the prompt
  config.task.system_prompt = (  # instruction given with every question
      "Solve the word problem step by step. End with the final number, like: The answer is 42.")
  config.task.accuracy_reward = "math_last_number"  # reward that defines held-out accuracy

  config.rewards = ml_collections.ConfigDict()
  config.rewards.math_last_number = 1.0  # weight of answer correctness (<answer>/boxed, else last number)

  common.rl(config, prompts_per_step=32, group_size=8, max_new_tokens=128, temperature=0.7)
  config.rl.mask_truncated = True  # DAPO's truncation masking (experiments/grpo_arith)
  common.optimizer(config, num_steps=config.get_ref("num_steps") * config.rl.get_ref("num_iterations"),
                   learning_rate=5e-4, warmup_steps=5, end_lr_ratio=1.0, b2=0.99)
  return common.apply_presets(config, arg, PRESETS)
