"""Agent RL: the calculator-tool agent on multi-step arithmetic word problems, trained from its traces.

  python launch.py --config configs/agent_rl.py --workdir runs/agent_rl              # GPU run
  python launch.py --config configs/agent_rl.py:smoke --workdir runs/agent_smoke    # CPU smoke test
  python launch.py --config configs/agent_rl.py:search_r1 ...   # the Search-R1 agent function instead
  Presets: search_r1, grpo, dr_grpo, ppo (the RL presets of configs/common.py without off-policy rows or refill;
  ppo: a LoRA critic and GAE over each transition's row, as the RL job: fineflax/jobs/agent_rl.py),
  discounted (credit gamma^(n-1-i) R instead of R to every call), smoke.
The agent is `fineflax.agents.calculator.CalculatorAgent`; its traces go to WORKDIR/agent_store.sqlite.
"""
import ml_collections

from configs import common
from fineflax.agents.calculator import CALC_PROMPT


def _smoke(config):
  """CPU smoke test (tiny batches, short calls): 816 s with SmolLM2-135M on 2 CPU cores shared with other jobs
  (load 8-11), 2026-11-27."""
  config.model.dtype = "float32"
  config.model.quant = "none"
  config.num_steps = 2
  config.eval_every = 2
  config.task.num_eval = 4
  config.task.num_train = 32
  config.agent.max_calls = 2
  config.agent.num_workers = 4
  config.rl.prompts_per_step = 2
  config.rl.group_size = 2
  config.rl.max_new_tokens = 8


def _discounted(config):  # later calls get more of the final reward: r_i = gamma^(n-1-i) R
  config.agent.credit = "discounted"
  config.agent.gamma = 0.9


def _search_r1(config):  # the Search-R1 agent function on the generated knowledge base (configs/search_r1.py)
  config.agent.name = "search_r1"
  config.agent.merge = True  # its calls continue each other: one row per rollout, as the built-in rollout
  config.rl.max_new_tokens = 448  # completion budget per rollout (model turns + inserted passages)
  config.rl.temperature = 1.0
  config.task.num_eval = 128  # held-out questions (half two-hop)
  common.search_r1_sections(config)
  config.search.format_weight = 0.1  # reward = EM + format_weight * well-formed trace


# RL presets that add no off-policy rows and no refill (dapo's dynamic sampling, luffy and exgrpo do)
PRESETS = {"grpo": common.RL_PRESETS["grpo"], "dr_grpo": common.RL_PRESETS["dr_grpo"], "ppo": common.RL_PRESETS["ppo"],
           "discounted": _discounted,
           "search_r1": _search_r1, "smoke": _smoke}


def get_config(arg: str = ""):
  config = ml_collections.ConfigDict()
  config.job = "agent_rl"  # fineflax.jobs.agent_rl
  config.seed = 0  # PRNG seed: LoRA init, task order, sampling
  config.num_steps = ml_collections.FieldReference(40)  # rollout batches, each followed by num_iterations updates
  config.eval_every = ml_collections.FieldReference(10)  # steps between held-out evaluations
  config.eval_at_start = True  # evaluate the untrained agent at step 0
  config.eval_batch_size = 128  # unused by this job (evaluation rollouts are batched by the LLM queue)

  common.model(config, quant="nf4", logits_chunk=128)
  common.lora(config, r=16, alpha=32.0, dropout=0.0)
  common.train(config)  # what is trained: lora (default) or full
  common.checkpoint(config, every=config.get_ref("eval_every"))

  config.task = ml_collections.ConfigDict()
  config.task.num_train = 4000  # distinct training problems
  config.task.num_eval = 128  # held-out problems (disjoint split)
  config.task.num_steps = (2, 3)  # operations per problem (inclusive range, 1..5): several calculator calls
  config.task.max_start = 20  # start counts are drawn from [2, max_start]
  config.task.max_addend = 10  # "gets x more" draws x from [1, max_addend]
  config.task.eval_seed = 10_000  # seed of the held-out problems

  config.agent = ml_collections.ConfigDict()
  config.agent.name = "calculator"  # the agent (fineflax.jobs.agent_rl.AGENTS)
  config.agent.prompt_template = CALC_PROMPT  # system prompt (the resource "prompt_template"; APO tunes it)
  config.agent.max_calls = 4  # LLM calls per rollout (each may make one calculator call)
  config.agent.merge = False  # true: merge a rollout's calls into one row (needs calls that continue each other)
  config.agent.credit = "final"  # reward of each call: final (R) or discounted (gamma^(n-1-i) R)
  config.agent.gamma = 1.0  # discount of the discounted credit
  config.agent.num_workers = 32  # rollout threads; their LLM calls are batched
  config.agent.max_batch = 256  # most LLM calls sampled together
  config.agent.max_attempts = 1  # attempts per rollout (an agent exception retries)
  config.agent.store = ""  # SQLite store path; "" = WORKDIR/agent_store.sqlite

  common.rl(config, prompts_per_step=16, group_size=8, max_new_tokens=64, temperature=0.7)
  # rl.max_new_tokens is the budget of each LLM call; agg_mode token-mean (DAPO) weights every token alike
  common.optimizer(config, num_steps=config.get_ref("num_steps") * config.rl.get_ref("num_iterations"),
                   learning_rate=5e-4, warmup_steps=5, end_lr_ratio=1.0, b2=0.99)
  return common.apply_presets(config, arg, PRESETS)
