"""Distillation: a teacher's token distributions -> a fresh LoRA on the NF4 student (arithmetic task).

  python launch.py --config configs/distill.py --workdir runs/distill                 # GPU-sized run
  python launch.py --config configs/distill.py:cpu --workdir runs/distill_cpu         # experiments/distill
  Teacher = base + adapter: --config.teacher.adapter=runs/grpo_arith/adapter (teacher.source "" reuses the
  student's quantised base); a separate larger model: --config.teacher.source=PATH --config.teacher.quant=none.
  Each step the teacher answers prompts_per_step training questions (its own prompt), and the student's LoRA
  is trained on forward KL(teacher || student) over those completion tokens (fineflax/train/distill_step.py).
"""
import ml_collections

from configs import common


def _cpu(config):  # the experiments/distill demonstration on a shared 2-core CPU
  config.model.dtype = "float32"
  config.num_steps = 8
  config.eval_every = 8
  config.optimizer.learning_rate = 2e-3
  config.task.num_eval = 32
  config.eval_batch_size = 32
  config.task.eval_max_new_tokens = 48
  config.teacher.max_new_tokens = 48
  config.distill.prompts_per_step = 8
  config.distill.only_correct = True  # the teacher (SmolLM2 without adapter) is right ~30% of the time
  config.teacher.source = "smollm2-135m-instruct"  # full-precision SmolLM2 (no GRPO adapter on this machine)


def get_config(arg: str = ""):
  config = ml_collections.ConfigDict()
  config.job = "distill"  # fineflax.jobs.distill
  config.seed = 0  # PRNG seed: LoRA init, question order, teacher sampling
  config.num_steps = ml_collections.FieldReference(100)  # optimizer updates, each on fresh teacher completions
  config.eval_every = ml_collections.FieldReference(25)  # steps between held-out evaluations of the student
  config.eval_at_start = True  # evaluate the teacher and the untrained student first
  config.eval_batch_size = 64  # prompts per greedy evaluation batch

  common.model(config, quant="nf4", logits_chunk=64)  # the student
  common.lora(config, r=4, alpha=8.0, dropout=0.0)  # the student's fresh adapter
  common.train(config)  # what is trained: lora (default) or full
  common.mesh(config)
  common.checkpoint(config, every=config.get_ref("eval_every"))

  config.teacher = ml_collections.ConfigDict()
  config.teacher.source = ""  # "" = the student's (quantised) base; else another model with the same vocabulary
  config.teacher.quant = "none"  # quantisation of a separate teacher: none, nf4 or int8
  config.teacher.adapter = ""  # PEFT LoRA folder of the teacher (e.g. a GRPO-trained adapter); "" = none
  config.teacher.system_prompt = ""  # the teacher's instruction; "" = config.task.system_prompt
  config.teacher.temperature = 0.7  # sampling temperature of the teacher's completions (0 = greedy)
  config.teacher.max_new_tokens = 96  # completion budget of the teacher

  config.task = ml_collections.ConfigDict()  # arithmetic word problems (fineflax/envs/arithmetic.py)
  config.task.num_train = 4000  # distinct training questions
  config.task.num_eval = 256  # held-out questions (disjoint split)
  config.task.num_steps = (1, 2)  # operations per problem (inclusive range, 1..5)
  config.task.max_start = 20  # start counts from [2, max_start]
  config.task.max_addend = 10  # "gets x more" draws x from [1, max_addend]
  config.task.eval_seed = 10_000  # seed of the held-out problems
  config.task.assistant_prefix = ""  # text the assistant turn starts with (prefilled)
  config.task.system_prompt = (  # the student's instruction (and the teacher's unless teacher.system_prompt)
      "Solve the word problem step by step. End with the final number, like: The answer is 42.")
  config.task.accuracy_reward = "math_last_number"  # reward that defines held-out accuracy
  config.task.eval_max_new_tokens = 96  # answer budget at evaluation

  config.distill = ml_collections.ConfigDict()
  config.distill.prompts_per_step = 16  # teacher completions per update
  config.distill.tau = 1.0  # temperature of both softmaxes in the KL
  config.distill.top_k = 0  # 0 = the teacher's full logits; k > 0 = its top-k renormalised (see distill_step)
  config.distill.only_correct = False  # KL only on teacher completions whose answer is right (rejection sampling)

  common.optimizer(config, num_steps=config.get_ref("num_steps"), learning_rate=1e-3, warmup_steps=3,
                   end_lr_ratio=1.0, b2=0.99)
  return common.apply_presets(config, arg, {"cpu": _cpu})
