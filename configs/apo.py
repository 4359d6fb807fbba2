"""APO: automatic prompt optimisation of the calculator agent's system prompt (beam search, textual gradients).

  python launch.py --config configs/apo.py --workdir runs/apo                 # GPU run (local critic/editor)
  python launch.py --config configs/apo.py:smoke --workdir runs/apo_smoke     # CPU smoke test
  presets: cpu (the ~20 min 2-core CPU run), gpu5 (Agent Lightning's sizes, <= ~5 min on one H100)
  Larger critic/editor behind an OpenAI-compatible server (this project's, or vLLM):
  --config.apo.critic.url=http://127.0.0.1:8000/v1 --config.apo.critic.model=NAME (same for apo.editor)
Parameter names follow Agent Lightning's APO (agentlightning.algorithm.apo).
"""
import ml_collections

from configs import common
from fineflax.agents.calculator import CALC_PROMPT


def _smoke(config):
  """CPU smoke test (tiny task sets, one round): 214 s with SmolLM2-135M on 2 CPU cores shared with other jobs
  (load 8-11), 2026-11-27."""
  config.model.dtype = "float32"
  config.model.quant = "none"
  config.task.num_train = 4
  config.task.num_val = 2
  config.task.num_test = 2
  config.agent.max_calls = 1
  config.agent.max_new_tokens = 8
  config.agent.num_workers = 2
  for s in (config.apo.critic, config.apo.editor):
    s.max_tokens = 8
  config.apo.update(val_batch_size=2, gradient_batch_size=1, beam_width=1, branch_factor=1, beam_rounds=1)


def _client(temperature=0.7, max_tokens=256):
  c = ml_collections.ConfigDict()
  c.url = ""  # OpenAI-compatible base URL (http://host:port/v1); "" = the in-process model
  c.model = "local"  # model name sent to the endpoint
  c.temperature = temperature  # sampling temperature of its replies
  c.max_tokens = max_tokens  # reply budget
  return c


def _cpu(config):  # the 2-core CPU run of experiments/agents/RESULTS.md (~20-25 min)
  config.model.dtype = "float32"
  config.model.quant = "none"  # NF4 dequantisation made CPU sampling ~3x slower
  config.task.num_val = 16
  config.task.num_test = 32
  config.agent.num_workers = 16
  config.apo.critic.max_tokens = 96
  config.apo.editor.max_tokens = 128
  config.apo.time_budget_s = 900.0


def _gpu5(config):  # one H100 in ~3-9 min: Agent Lightning's example sizes (29 validation tasks, 2 rounds)
  config.task.num_val = 29
  config.apo.update(val_batch_size=29, gradient_batch_size=4, beam_width=2, branch_factor=2, beam_rounds=2,
                    time_budget_s=330.0)


PRESETS = {"smoke": _smoke, "cpu": _cpu, "gpu5": _gpu5}


def get_config(arg: str = ""):
  config = ml_collections.ConfigDict()
  config.job = "apo"  # fineflax.jobs.apo
  config.seed = 0  # seed of the task split, the batch sampling and the samplers
  common.model(config, quant="nf4")  # the agent_rl base: SmolLM2-135M-Instruct, NF4
  config.model.adapter = ""  # PEFT adapter folder applied to the agent model (e.g. an agent_rl run's adapter)

  config.task = ml_collections.ConfigDict()
  config.task.num_train = 64  # problems behind the critiques (train split)
  config.task.num_val = 32  # validation problems scoring candidates (train split, disjoint from num_train)
  config.task.num_test = 128  # held-out problems: seed vs best prompt, greedy
  config.task.num_steps = (2, 3)  # operations per problem (inclusive range, 1..5)
  config.task.max_start = 20  # start counts are drawn from [2, max_start]
  config.task.max_addend = 10  # "gets x more" draws x from [1, max_addend]
  config.task.eval_seed = 10_000  # seed of the test problems

  config.agent = ml_collections.ConfigDict()
  config.agent.prompt_template = CALC_PROMPT  # the seed prompt (resource "prompt_template")
  config.agent.max_calls = 4  # LLM calls per rollout
  config.agent.max_new_tokens = 64  # tokens per agent call
  config.agent.temperature = 0.7  # the agent's sampling temperature during the search
  config.agent.num_workers = 32  # rollout threads (their calls are batched)

  config.apo = ml_collections.ConfigDict()
  config.apo.val_batch_size = 16  # validation tasks scoring each round's candidates
  config.apo.gradient_batch_size = 4  # train rollouts behind each critique
  config.apo.beam_width = 2  # prompts kept after each round
  config.apo.branch_factor = 2  # children per parent and round
  config.apo.beam_rounds = 2  # rounds
  config.apo.min_prompt_chars = 20  # a rewritten prompt shorter than this is rejected (logged, not scored)
  config.apo.max_prompt_chars = 2000  # and a longer one
  config.apo.required = ()  # strings a rewritten prompt must keep, e.g. ("<calc>",): SmolLM2 as editor dropped
  # the tags from every rewrite (experiments/agents/RESULTS.md), so by default validation decides
  config.apo.time_budget_s = 0.0  # no new round starts after this many seconds of search (0 = no limit)
  config.apo.critic = _client()  # writes the textual gradient
  config.apo.editor = _client()  # rewrites the prompt along it
  return common.apply_presets(config, arg, PRESETS)
