"""Search-R1 on a generated knowledge base with SmolLM2-135M-Instruct + QLoRA (LUFFY with demonstrations).

  python launch.py --config configs/search_r1.py --workdir runs/search_r1               # GPU run
  python launch.py --config configs/search_r1.py:smoke --workdir runs/search_r1_smoke   # CPU smoke test
  Presets: grpo_only (no demonstrations), smoke, and the RL presets of configs/common.py (e.g. dr_grpo).
  External retriever: python -m retrieval.server --corpus kb.jsonl --kind bm25 --port 8000, then
  --config.search.url=http://127.0.0.1:8000/retrieve
"""
import ml_collections

from configs import common


def _grpo_only(config):  # plain GRPO: no demonstration rows
  config.rl.objective = "grpo"
  del config.rl["luffy"]


def _smoke(config):
  """CPU smoke test (tiny KB and batches, short turns): 305 s with SmolLM2-135M on 2 CPU cores shared with other jobs
  (load 8-11), 2026-11-27."""
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


PRESETS = {**common.RL_PRESETS, "grpo_only": _grpo_only, "smoke": _smoke}


def get_config(arg: str = ""):
  config = ml_collections.ConfigDict()
  config.job = "rl"  # fineflax.jobs.rl
  config.env = "search_r1"  # fineflax.envs: multi-turn rollouts with a search engine
  config.seed = 0  # PRNG seed: LoRA init, question order, sampling
  config.num_steps = ml_collections.FieldReference(30)  # rollout batches, each followed by num_iterations updates
  config.eval_every = ml_collections.FieldReference(15)  # steps between held-out evaluations
  config.eval_at_start = True  # evaluate the untrained model at step 0
  config.eval_batch_size = 128  # questions per greedy evaluation batch
  config.num_eval = 128  # held-out questions (half two-hop)

  common.model(config, quant="nf4", logits_chunk=128)
  common.lora(config, r=16, alpha=32.0, dropout=0.0)
  common.train(config)  # what is trained: lora (default) or full
  common.checkpoint(config, every=config.get_ref("eval_every"))
  common.mesh(config)

  common.search_r1_sections(config)

  config.rewards = ml_collections.ConfigDict()
  config.rewards.search_r1_em = 1.0  # exact match of the final answer (the Search-R1 reward)
  config.rewards.search_r1_format = 0.1  # well-formed trace (every turn <think> then one action)
  config.rewards.search_r1_searched = 0.0  # searched at least once

  common.rl(config, prompts_per_step=16, group_size=5, max_new_tokens=448, temperature=1.0,
            objective="luffy")
  config.rl.epsilon_high = 0.2  # symmetric clip
  common.luffy_section(config.rl, n_off=1)  # one scripted demonstration (real searches) per group
  common.optimizer(config, num_steps=config.get_ref("num_steps") * config.rl.get_ref("num_iterations"),
                   learning_rate=3e-4, warmup_steps=3, end_lr_ratio=1.0, b2=0.99)
  return common.apply_presets(config, arg, PRESETS)
