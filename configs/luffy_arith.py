"""LUFFY's Table at toy scale: on-policy RL vs SFT vs SFT+RL vs LUFFY vs LUFFY without shaping, on 2-3
operation word problems where SmolLM2-135M-Instruct rarely succeeds (experiments/luffy).

  python launch.py --config configs/luffy_arith.py:luffy --workdir runs/luffy            # one method
  python -m experiments.luffy.run --model SOURCE --out DIR                                 # all five, 4 seeds
  Presets (comma-separated, in order):
    (none)         on-policy RL, the strongest settings found (experiments/grpo_arith): DAPO's loss
                   (token-mean, clip-higher 0.28) without dynamic sampling, T=0.7, truncated rows masked
    sft            SFT on the solver's worked solutions (the traces LUFFY mixes in) for every step
    sft_rl         50 SFT steps, then on-policy RL from that adapter (give num_steps = 50 + the RL steps)
    luffy          LUFFY as in the official exp_scripts/train.sh: 1 trace in each group of 8, no
                   on-policy clip, sum / max_len aggregation, no std scaling, entropy bonus 0.001,
                   shaping gamma 0.1, rollouts at T=1.0, no truncation masking
    luffy_noshape  luffy without policy shaping (the paper's ablation: -A * p on trace tokens)
    smoke          CPU smoke test: 575 s with SmolLM2-135M on 2 CPU cores shared with other jobs (load 8-11),
                   2026-11-27
  Evaluation (fineflax/envs/arithmetic.py): greedy accuracy and pass@8 (T=0.7) on held-out 2-3 operation
  problems (task.eval_split: test, or validation to tune), on 4-5 operations (eval_ood_ops_*) and on the
  same problems in a second wording (eval_ood_phrasing_*).
"""
from configs import common, grpo_arith

SFT_RL_SFT_STEPS = 50


def _sft(config):
  config.rl.sft_steps = config.get_ref("num_steps")  # every step is an SFT step


def _sft_rl(config):
  config.rl.sft_steps = SFT_RL_SFT_STEPS


def _luffy(config):
  common.RL_PRESETS["luffy"](config)
  config.rl.update(temperature=1.0, mask_truncated=False)


def _luffy_noshape(config):
  _luffy(config)
  config.rl.luffy.shaping = False


def _smoke(config):
  grpo_arith.PRESETS["smoke"](config)
  config.model.quant = "none"  # smaller programs to compile (NF4 has its own tests)
  config.task.update(num_train=32, num_eval=8, pass_k=2, pass_k_items=4)
  config.eval_batch_size = 8  # every sampling call has 8 rows, as the rollouts (2 questions x 4)
  config.rl.max_new_tokens = 16
  if config.rl.sft_steps == SFT_RL_SFT_STEPS:  # sft_rl: 1 SFT step, then RL
    config.rl.sft_steps = 1


PRESETS = {**common.RL_PRESETS, "sft": _sft, "sft_rl": _sft_rl, "luffy": _luffy,
           "luffy_noshape": _luffy_noshape, "smoke": _smoke}


def get_config(arg: str = ""):
  config = grpo_arith.get_config("")
  config.num_steps = 150
  config.eval_every = 30
  config.eval_batch_size = 768  # rows per evaluation sampling call (pass@k: prompts x k)
  t = config.task
  t.num_steps = (2, 3)  # operations per training / in-distribution problem
  t.max_start = 20
  t.max_addend = 10
  t.num_eval = 256  # held-out problems per evaluation set
  t.eval_split = "test"  # test (report) or validation (tune): disjoint held-out problems
  t.ood_num_steps = (4, 5)  # out of distribution: more operations
  t.ood_template = "box"  # out of distribution: the same problems in a second wording
  t.pass_k = 8  # pass@k: k samples per problem at pass_temperature
  t.pass_k_items = 96  # problems per set that get k samples (0 = all): 768 sampled rows per set
  t.pass_temperature = 0.7
  # R1-style: the assistant turn opens with "<think>\n" (prefilled), as the solver's traces do
  t.assistant_prefix = "<think>\n"
  t.system_prompt = ("Think step by step inside <think> </think>, then give the final number inside "
                     "<answer> </answer>.")
  config.rl.max_new_tokens = 192
  return common.apply_presets(config, arg, PRESETS)
