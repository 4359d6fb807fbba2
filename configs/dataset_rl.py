"""RL on prompts read from dataset files: LUFFY's openr1.parquet, Search-R1's nq_hotpotqa_train, GSM8K, MATH.

  python launch.py --config configs/dataset_rl.py:luffy --workdir runs/luffy_data \
      --config.dataset.train=data/openr1.parquet --config.dataset.eval=data/valid.parquet
  python launch.py --config configs/dataset_rl.py:luffy,smoke --workdir runs/luffy_sample   # CPU, shipped samples
  Presets (comma-separated, in order):
    luffy      LUFFY's exp_scripts/train.sh at its settings that fit LoRA: format luffy (the row's `target`
               is the off-policy trace, 1 per group of 8), reward math_think (math-verify after </think>, as
               reward_impl_version=3), rollouts at T=1.0, validation at T=0.6 (val_temperature, n_val=1),
               prompts <= 1024 and responses <= 8192 tokens
    search_r1  Search-R1's nq_hotpotqa_train parquet (question, golden_answers, data_source) with exact match
               on the <answer>; single-turn (no search tool: configs/search_r1.py runs search rollouts)
    gsm8k      GSM8K rows ("#### n" answers), reward math
    math       MATH rows (\\boxed{} solutions), reward math
    smoke      CPU smoke test (2 steps, tiny batches, f32, no quantisation)
  The files default to the shipped samples (fineflax/data/samples/, format luffy); point dataset.train and
  dataset.eval at your copies of the papers' files.
"""
import ml_collections

from configs import common


def dataset(config, train="sample:luffy_openr1.parquet", eval="sample:luffy_valid.parquet", format="luffy"):
  config.dataset = d = ml_collections.ConfigDict()
  d.train = train  # parquet / JSONL path, glob or comma list ("sample:NAME" = a shipped sample), or a hub name
  d.eval = eval  # held-out rows (same forms); "" = no evaluation
  d.split = "train"  # split of a hub dataset (train)
  d.eval_split = "test"  # split of a hub dataset (eval)
  d.format = format  # field map: luffy, search_r1, gsm8k, math or custom (fineflax.data.rl_prompts.FORMATS)
  d.fields = ml_collections.ConfigDict()  # overrides of the map ("" / () keep the format's)
  d.fields.question = ""  # field holding the prompt text (a user turn)
  d.fields.messages = ""  # field holding the prompt as chat messages
  d.fields.ground_truth = ""  # field holding the reference answer (dotted path, e.g. reward_model.ground_truth)
  d.fields.answer_rule = ""  # "", gsm8k (text after ####) or boxed (last \boxed{} content)
  d.fields.data_source = ""  # field naming each row's source / benchmark
  d.fields.source_name = ""  # one source name for every row (when there is no such field)
  d.fields.target = ""  # field holding the off-policy trace (messages or text)
  d.fields.reward_kwargs = ()  # fields passed to rewards as extra example keys
  d.system_prompt = ""  # system turn added to prompts without one ("" = none)
  d.assistant_prefix = ""  # text the assistant turn starts with (prefilled; stripped from traces)
  d.on_bad_row = "error"  # error: stop at the first unusable row (named); skip: count and name them
  d.streaming = False  # read rows in order instead of through datasets' Arrow cache (no ExGRPO replay)
  d.buffer_size = 1000  # shuffle buffer of streaming reads
  d.accuracy_reward = "math_think"  # registry reward that defines held-out accuracy
  d.num_eval = 0  # evaluation rows (0 = all)
  d.eval_n = 1  # completions per evaluation row (avg@n, pass@n)
  d.eval_temperature = 0.0  # 0 = greedy
  d.eval_top_p = 1.0
  return config


def _luffy(config):
  common.RL_PRESETS["luffy"](config)
  config.rl.update(temperature=1.0, mask_truncated=False, max_new_tokens=8192, group_size=8)
  config.dataset.update(format="luffy", accuracy_reward="math_think", eval_temperature=0.6, eval_top_p=1.0)
  config.rewards = ml_collections.ConfigDict({"math_think": 1.0})


def _search_r1(config):
  config.dataset.update(format="search_r1", accuracy_reward="exact_match", train="", eval="")
  config.rewards = ml_collections.ConfigDict({"exact_match": 1.0})


def _gsm8k(config):
  config.dataset.update(format="gsm8k", accuracy_reward="math", train="", eval="")
  config.rewards = ml_collections.ConfigDict({"math": 1.0})


def _math(config):
  config.dataset.update(format="math", accuracy_reward="math", train="", eval="")
  config.rewards = ml_collections.ConfigDict({"math": 1.0})


def _smoke(config):
  """CPU smoke test (2 steps, tiny batches): 140 s with SmolLM2-135M on 2 CPU cores shared with other jobs
  (load ~6, 2026-11-27; `:luffy,smoke` on the shipped samples), most of it compiling."""
  config.model.dtype = "float32"
  config.model.quant = "none"
  config.num_steps = 2
  config.eval_every = 2
  config.eval_at_start = False
  config.eval_batch_size = 4
  config.dataset.num_eval = 4
  config.rl.prompts_per_step = 2
  config.rl.group_size = 4
  config.rl.max_new_tokens = 16


PRESETS = {**common.RL_PRESETS, "luffy": _luffy, "search_r1": _search_r1, "gsm8k": _gsm8k, "math": _math,
           "smoke": _smoke}


def get_config(arg: str = ""):
  config = ml_collections.ConfigDict()
  config.job = "rl"  # fineflax.jobs.rl
  config.env = "dataset"  # fineflax.envs.dataset: prompts, traces and references from config.dataset
  config.seed = 0  # PRNG seed: LoRA init, question order (reshuffled every epoch), sampling
  config.num_steps = ml_collections.FieldReference(500)  # rollout batches (LUFFY: about 500)
  config.eval_every = ml_collections.FieldReference(10)  # steps between evaluations (LUFFY test_freq 10)
  config.eval_at_start = True  # evaluate the untrained model at step 0
  config.eval_batch_size = 128  # completions per evaluation sampling call

  common.model(config, quant="nf4", logits_chunk=128)
  common.lora(config, r=16, alpha=32.0, dropout=0.0)
  common.train(config)  # what is trained: lora (default) or full
  common.checkpoint(config, every=config.get_ref("eval_every"))
  common.mesh(config)
  dataset(config)

  config.rewards = ml_collections.ConfigDict()
  config.rewards.math_think = 1.0  # math-verify on the text after </think> (LUFFY's reward version 3)

  common.rl(config, prompts_per_step=128, group_size=8, max_new_tokens=1024, temperature=1.0)
  common.optimizer(config, num_steps=config.get_ref("num_steps") * config.rl.get_ref("num_iterations"),
                   learning_rate=1e-5, warmup_steps=0, end_lr_ratio=1.0, b2=0.99)  # LoRA (LUFFY: 1e-6, full FT)
  return common.apply_presets(config, arg, PRESETS)
